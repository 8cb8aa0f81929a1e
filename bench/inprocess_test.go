package main

import (
	"context"
	"sync/atomic"
	"testing"
)

// BenchmarkInProcess measures one decision of every in-process target
// (sluice on memstore and its in-process peers) the way issue #9's target
// is stated: time per decision from one goroutine (serial) and from
// b.RunParallel (parallel), each decision an allowed-mode one on one of
// 1 024 subjects that all hold state before the clock starts. The targets
// are the command's own (targets.go: same build, same limits, same
// subjects), only without the command's per-call latency measurement,
// which costs more than a decision does here. Compare the rows of one run:
//
//	cd bench && go test -run '^$' -bench InProcess -benchmem -count 2
func BenchmarkInProcess(b *testing.B) {
	const subjects = 1024
	e := &env{subjects: newSubjects(subjects)}
	ctx := context.Background()
	for _, t := range allTargets() {
		if t.kind != inProcess {
			continue
		}
		b.Run(t.name, func(b *testing.B) {
			d, release, err := t.build(ctx, e, allowedMode)
			if err != nil {
				b.Fatal(err)
			}
			defer release()
			for i := range subjects {
				if _, err := d(ctx, i); err != nil {
					b.Fatal(err)
				}
			}
			// decide takes the decision for the next subject of rng, as
			// the command's load picks it.
			decide := func(b *testing.B, rng *uint64) {
				if _, err := d(ctx, nextSubject(rng, subjects)); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("serial", func(b *testing.B) {
				b.ReportAllocs()
				rng := uint64(0x9E3779B97F4A7C15)
				for b.Loop() {
					decide(b, &rng)
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.ReportAllocs()
				var seed atomic.Uint64
				b.RunParallel(func(pb *testing.PB) {
					rng := seed.Add(0x9E3779B97F4A7C15) // each goroutine its own sequence
					for pb.Next() {
						decide(b, &rng)
					}
				})
			})
		})
	}
}
