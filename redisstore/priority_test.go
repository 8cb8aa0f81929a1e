package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestPrioritiesUnderContention is issue 34's third done-when, on real
// Redis: two Limiters, each over a store of its own client, share one
// policy of 100 per window whose sheddable class may use 30 %; in each
// window 64 goroutines (32 per Limiter) send 4 requests each, two
// sheddable then two critical, all at once (sheddable asks 128 times,
// far past its 30, before most critical requests come). Counted per class per window:
// sheddable is admitted at most 30 times (it never uses the reserved
// part), and sheddable and critical together exactly 100 (critical takes
// everything sheddable leaves, up to the full limit). Every algorithm,
// and concurrency by leases, on the caller's clock, which moves only
// between windows (two windows on, so each starts fresh); fixed_window and
// sliding_log also on Redis time, in one window of a day.
func TestPrioritiesUnderContention(t *testing.T) {
	algs := append(append([]sluice.Algorithm{}, algorithms...), sluice.Concurrency)
	for _, a := range algs {
		t.Run(a.String(), func(t *testing.T) {
			clock := sluicetest.NewClock()
			opts := redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour}
			ls := priorityLimiters(t, a, opts)
			for round := range 4 {
				contend(t, ls, a, round)
				clock.Advance(2 * time.Minute)
			}
		})
	}
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog} {
		t.Run(a.String()+"/redis-time", func(t *testing.T) {
			contend(t, priorityLimiters(t, a, redisstore.Options{}), a, 0)
		})
	}
}

// priorityLimiters returns two Limiters, each over a store of its own
// client to the shared Redis, of one policy "p" of algorithm a: 100 per
// minute (a day on Redis time), or 100 leases, sheddable 30 %.
func priorityLimiters(t *testing.T, a sluice.Algorithm, opts redisstore.Options) [2]*sluice.Limiter {
	p := sluice.Policy{ID: "p", Algorithm: a, Limit: 100, Window: time.Minute, Priorities: map[string]int{"critical": 100, "sheddable": 30}}
	switch {
	case a == sluice.Concurrency:
		p.Window, p.LeaseTTL = 0, time.Minute
	case opts.Clock == nil:
		p.Window = 24 * time.Hour
	}
	var ls [2]*sluice.Limiter
	for i := range ls {
		l, err := sluice.New(newStore(t, standaloneClient(t), opts), []sluice.Policy{p}, sluice.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	return ls
}

// contend runs one window's requests through ls for a fresh subject and
// checks the counts per class.
func contend(t *testing.T, ls [2]*sluice.Limiter, a sluice.Algorithm, round int) {
	t.Helper()
	const goroutines, each, limit, ceiling = 64, 4, 100, 30
	subj := subject(t)
	op := sluice.Spend
	if a == sluice.Concurrency {
		op = sluice.Acquire
	}
	var admitted [2]atomic.Int64 // sheddable, critical
	var wg sync.WaitGroup
	start := make(chan struct{})
	bad := make(chan sluice.Outcome, goroutines*each)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range each {
				c := i / 2 // sheddable first, so it presses on its ceiling
				o := ls[g%2].Check(context.Background(), sluice.Request{Op: op, Policy: "p", Subject: subj, Priority: []string{"sheddable", "critical"}[c]})
				switch o.Kind {
				case sluice.Allowed:
					admitted[c].Add(1)
				case sluice.Denied:
				default:
					bad <- o
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(bad)
	for o := range bad {
		t.Errorf("round %d: Check = %v (%v), want allowed or denied", round, o.Kind, o.Err)
	}
	shed, crit := admitted[0].Load(), admitted[1].Load()
	t.Logf("round %d: %d sheddable, %d critical admitted of %d requests each", round, shed, crit, goroutines*each/2)
	if shed > ceiling || shed+crit != limit {
		t.Fatalf("round %d: %d sheddable + %d critical admitted, want at most %d sheddable (30 %% of %d) and exactly %d in all", round, shed, crit, ceiling, limit, limit)
	}
}
