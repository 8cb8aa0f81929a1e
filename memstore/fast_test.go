package memstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestStoreGeneralPath runs the behavioural suite with every decision on
// the general path, the one the common decision skips (TestStore runs it
// with the fast path taking those).
func TestStoreGeneralPath(t *testing.T) {
	sluicetest.TestStore(t, func(t *testing.T, clock sluice.Clock) sluice.Store {
		s := mustNew(t, Options{Clock: clock})
		s.general = true
		return s
	})
}

// TestFastPathMatchesGeneral drives the same random sequences through a
// store that takes the common decision (one policy, a spend or a peek) on
// its fast path and one that takes every decision on the general path, on
// one fake clock: spends within and beyond MaxCost, peeks, refunds (the
// general path on either), clocks that step back, new numbers and another
// algorithm under one revision. Every status, error and count of states
// must agree.
func TestFastPathMatchesGeneral(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rates := []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA}
	for _, a := range rates {
		t.Run(a.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(a)))
			clock := sluicetest.NewClock()
			fast := mustNew(t, Options{Clock: clock, SweepInterval: -1})
			general := mustNew(t, Options{Clock: clock, SweepInterval: -1})
			general.general = true
			var p *sluice.Policy
			subject := ""
			now := clock.Now()
			fastTaken := 0 // the decisions the store itself sent down the fast path
			fast.onFast = func() { fastTaken++ }
			for step := range 4000 {
				switch {
				case step%400 == 0:
					p = fastPolicy(r, a)
					subject = fmt.Sprint("s.", step)
				case r.IntN(25) == 0:
					p = fastPolicy(r, a) // new numbers under the same revision
				case r.IntN(60) == 0:
					p = fastPolicy(r, rates[r.IntN(len(rates))]) // another algorithm's state under it
				}
				now = now.Add(time.Duration(fastStep(r, p.Window.Microseconds())) * time.Microsecond)
				clock.Set(now)
				op, cost := sluice.Spend, int64(1)
				switch r.IntN(10) {
				case 0, 1:
					op, cost = sluice.Peek, 0
				case 2:
					op = sluice.Refund
					if p.Algorithm == sluice.SlidingWindow {
						op = sluice.Spend
					}
				case 3:
					cost = p.MaxCost + int64(r.IntN(2)) // beyond it: refused on both
				case 4:
					cost = 1 + r.Int64N(min(p.MaxCost, 1000))
				}
				ps := []*sluice.Policy{p}
				want := &sluice.Evaluation{Op: op, Subject: subject, Policies: ps, Cost: cost}
				got := &sluice.Evaluation{Op: op, Subject: subject, Policies: ps, Cost: cost}
				werr := general.Evaluate(context.Background(), want)
				gerr := fast.Evaluate(context.Background(), got)
				if fmt.Sprint(gerr) != fmt.Sprint(werr) || !slices.Equal(got.Statuses, want.Statuses) || got.Replayed != want.Replayed {
					t.Fatalf("seed %d step %d: %v cost %d on %+v: fast path = %+v, %v; general = %+v, %v", seed, step, op, cost, *p, got.Statuses, gerr, want.Statuses, werr)
				}
				if fast.Len() != general.Len() {
					t.Fatalf("seed %d step %d: fast path holds %d states, general %d", seed, step, fast.Len(), general.Len())
				}
			}
			if fastTaken < 2000 {
				t.Fatalf("the store took its fast path for only %d of 4000 steps", fastTaken)
			}
		})
	}
}

// fastPolicy draws a valid policy of a under the one ID and revision.
func fastPolicy(r *rand.Rand, a sluice.Algorithm) *sluice.Policy {
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, time.Hour}
	limits := []int64{1, 2, 3, 10, 1000, 100_000}
	for {
		p := sluice.Policy{ID: "fast", Algorithm: a, Limit: limits[r.IntN(len(limits))], Window: windows[r.IntN(len(windows))]}
		if (a == sluice.TokenBucket || a == sluice.GCRA) && r.IntN(2) == 0 {
			p.Burst = 1 + r.Int64N(3*p.Limit)
		}
		p.ClockAligned = a == sluice.FixedWindow && r.IntN(2) == 0
		if r.IntN(4) == 0 {
			p.MaxCost = 1 + r.Int64N(p.Limit)
		}
		if p.Validate() == nil {
			p = evaluation.Defaults(p)
			return &p
		}
	}
}

// fastStep draws a clock step for a window of w µs: none, small, within
// the window, beyond it, or backwards.
func fastStep(r *rand.Rand, w int64) int64 {
	switch r.IntN(8) {
	case 0:
		return 0
	case 1:
		return r.Int64N(1000)
	case 2, 3:
		return r.Int64N(w/4 + 1)
	case 4:
		return r.Int64N(w)
	case 5:
		return w + r.Int64N(2*w)
	case 6:
		return -r.Int64N(1000)
	default:
		return -r.Int64N(w)
	}
}
