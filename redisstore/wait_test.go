package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestWaitReplicas: with WaitReplicas 1 over a master and its replica, a
// decision is answered once its writes are on the replica, alone or
// queued with others. With the replica stopped (SIGSTOP) WAIT counts
// none: the decision, spent on the master, is Indeterminate, and its
// retry with its evaluation id replays it. Asking for more replicas than
// there are makes every decision Indeterminate.
func TestWaitReplicas(t *testing.T) {
	ctx := context.Background()
	master := redistest.Standalone(t)
	replica := redistest.Replica(t, master)
	mc, rc := master.Client(), replica.Client()
	defer mc.Close()
	defer rc.Close()
	s := newStore(t, mc, redisstore.Options{WaitReplicas: 1, Timeout: 2 * time.Second, Breaker: redisstore.BreakerOptions{Failures: -1}})
	plain := newStore(t, mc, redisstore.Options{}) // for peeks that wait for nothing
	p := policy(t, "durable", sluice.FixedWindow, 1000, time.Hour)
	subj := subject(t)
	onReplica := func(what string) {
		t.Helper()
		mv, merr := mc.Get(ctx, s.Key(subj, p)).Result()
		rv, rerr := rc.Get(ctx, s.Key(subj, p)).Result()
		if merr != nil || rerr != nil || mv != rv {
			t.Fatalf("%s: the replica holds %q (%v), the master %q (%v): want the decision's write on the replica when it is answered", what, rv, rerr, mv, merr)
		}
	}
	for i := range 3 {
		if st := mustEvaluate(t, s, subj, 1, p); !st[0].Allowed || st[0].Remaining != int64(999-i) {
			t.Fatalf("decision %d = %+v", i, st[0])
		}
		onReplica(fmt.Sprintf("decision %d alone", i))
	}
	// Queued: decisions that meet go in pipelines, each followed by WAIT.
	const at = 30
	errs := make([]error, at)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = evaluate(ctx, s, subj, 1, p) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("queued decision %d: %v", i, err)
		}
	}
	onReplica("after the queued decisions")
	if st := mustEvaluate(t, plain, subj, 0, p); st[0].Remaining != 1000-3-at {
		t.Fatalf("remaining after %d decisions = %d", 3+at, st[0].Remaining)
	}

	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Resume() })
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := l.Check(ctx, sluice.Request{Policy: "durable", Subject: subj, EvaluationID: "job-1"})
	if o.Kind != sluice.Indeterminate || !errors.Is(o.Err, sluice.ErrIndeterminate) || !strings.Contains(o.Err.Error(), "0 of 1 replicas") {
		t.Fatalf("decision with the replica stopped = %+v (%v), want Indeterminate: acknowledged by 0 of 1 replicas", o, o.Err)
	}
	if st := mustEvaluate(t, plain, subj, 0, p); st[0].Remaining != 1000-3-at-1 {
		t.Fatalf("remaining after the unacknowledged decision = %d, want %d: spent on the master", st[0].Remaining, 1000-3-at-1)
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	o = l.Check(ctx, sluice.Request{Policy: "durable", Subject: subj, EvaluationID: "job-1"})
	if o.Kind != sluice.Allowed || !o.Replayed {
		t.Fatalf("retry of the unacknowledged decision = %+v (%v), want allowed, replayed", o, o.Err)
	}
	onReplica("after the replica is back")

	two := newStore(t, mc, redisstore.Options{WaitReplicas: 2, Timeout: 400 * time.Millisecond, Breaker: redisstore.BreakerOptions{Failures: -1}})
	_, err = evaluate(ctx, two, subj, 1, p)
	if !errors.Is(err, sluice.ErrIndeterminate) || !strings.Contains(err.Error(), "1 of 2 replicas") {
		t.Fatalf("WaitReplicas 2 with one replica = %v, want Indeterminate: acknowledged by 1 of 2 replicas", err)
	}
	if _, err := redisstore.New(mc, redisstore.Options{WaitReplicas: -1}); err == nil {
		t.Fatal("New with WaitReplicas -1 succeeded")
	}
}

// BenchmarkWaitReplicas measures what WaitReplicas 1 costs a decision,
// over a master and its replica on loopback: one caller deciding one
// decision after another, and 64 callers at once (their decisions share
// round trips, each followed by one WAIT). Compare each with its "no
// WAIT" twin of the same run:
//
//	go test ./redisstore -run '^$' -bench WaitReplicas -count 3
func BenchmarkWaitReplicas(b *testing.B) {
	master, err := redistest.StartServer("")
	if err != nil {
		b.Fatal(err)
	}
	defer master.Stop()
	replica, err := redistest.StartReplica(master)
	if err != nil {
		b.Fatal(err)
	}
	defer replica.Stop()
	c := master.Client()
	defer c.Close()
	p := policy(b, "bench-wait", sluice.FixedWindow, 1_000_000_000, time.Hour)
	for _, wait := range []int{0, 1} {
		name := "no WAIT"
		if wait > 0 {
			name = fmt.Sprintf("WAIT %d", wait)
		}
		s, err := redisstore.New(c, redisstore.Options{WaitReplicas: wait})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/sequential", func(b *testing.B) {
			subj := subject(b)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := evaluate(ctx, s, subj, 1, p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/64 callers", func(b *testing.B) {
			subj := subject(b)
			ctx := context.Background()
			b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := evaluate(ctx, s, subj, 1, p); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		s.Close()
	}
}
