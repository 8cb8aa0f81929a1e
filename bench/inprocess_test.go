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
//
// Beside ns/op (wall time) each row reports cpu-ns/op: this process's CPU
// time (user + system) per decision, all goroutines together. On a
// machine shared with other work, wall time also counts the time the
// benchmark waited for a core, and CPU time does not; in parallel,
// cpu-ns/op above the serial figure is what running at once costs
// (contention, cache lines moving between cores). The control row does no
// shared work at all (a xorshift loop of about a decision's length): how
// its parallel ns/op compares with its serial one is how much of a second
// core the machine gave the run.
func BenchmarkInProcess(b *testing.B) { benchInProcess(b, 1024) }

// BenchmarkInProcess10000 is BenchmarkInProcess over 10 000 subjects, as
// issue 37's target is stated.
func BenchmarkInProcess10000(b *testing.B) { benchInProcess(b, 10_000) }

// BenchmarkInProcessHot is BenchmarkInProcess on one hot subject: its
// parallel row against its serial one is what the hot subject's lock
// costs when both cores decide for it at once.
func BenchmarkInProcessHot(b *testing.B) { benchInProcess(b, 1) }

func benchInProcess(b *testing.B, subjects int) {
	e := &env{subjects: newSubjects(subjects)}
	ctx := context.Background()
	targets := []target{controlTarget()}
	for _, t := range allTargets() {
		if t.kind == inProcess {
			targets = append(targets, t)
		}
	}
	for _, t := range targets {
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
				cpu0 := processCPU()
				for b.Loop() {
					decide(b, &rng)
				}
				reportCPU(b, cpu0)
			})
			b.Run("parallel", func(b *testing.B) {
				b.ReportAllocs()
				var seed atomic.Uint64
				cpu0 := processCPU()
				b.RunParallel(func(pb *testing.PB) {
					rng := seed.Add(0x9E3779B97F4A7C15) // each goroutine its own sequence
					for pb.Next() {
						decide(b, &rng)
					}
				})
				reportCPU(b, cpu0)
			})
		})
	}
}

// reportCPU reports the process CPU time since cpu0 (µs) per operation.
func reportCPU(b *testing.B, cpu0 float64) {
	b.ReportMetric((processCPU()-cpu0)*1e3/float64(b.N), "cpu-ns/op")
}

// controlSink keeps the control's work from being optimised away.
var controlSink atomic.Uint64

// controlTarget is no limiter: 64 rounds of xorshift on the subject's
// index, about as long as a decision, touching no memory another
// goroutine touches.
func controlTarget() target {
	return target{
		name: "control: no shared state", kind: inProcess, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			return func(ctx context.Context, i int) (int, error) {
				x := uint64(i) | 1
				for range 64 {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
				}
				if x == 0 {
					controlSink.Store(x)
				}
				return 1, nil
			}, func() {}, nil
		},
	}
}
