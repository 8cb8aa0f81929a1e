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
	"github.com/sluicehq/sluice/internal/form"
	"github.com/sluicehq/sluice/internal/testkit/draw"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestStoreGeneralPath runs the behavioural suite with every decision on
// the general course (TestStore runs it with the short course taking the
// decisions the Limiter records in the short form).
func TestStoreGeneralPath(t *testing.T) {
	sluicetest.TestStore(t, func(t *testing.T, clock sluice.Clock) sluice.Store {
		return generalOnly{mustNew(t, Options{Clock: clock})}
	})
}

// generalOnly hands its Store every decision as an Evaluation built anew,
// in the general form: what the Limiter recorded is not copied.
type generalOnly struct{ sluice.Store }

func (g generalOnly) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	gen := sluice.Evaluation{Op: ev.Op, Subject: ev.Subject, Policies: ev.Policies, Cost: ev.Cost, LeaseID: ev.LeaseID,
		EvaluationID: ev.EvaluationID, Previous: ev.Previous, Priority: ev.Priority, Hold: ev.Hold, MaxWait: ev.MaxWait, Statuses: ev.Statuses}
	err := g.Store.Evaluate(ctx, &gen)
	ev.Statuses, ev.Replayed, ev.Batch = gen.Statuses, gen.Replayed, gen.Batch
	return err
}

// TestShortMatchesGeneral drives the same random sequences through the
// short course (each Evaluation recorded in its form as the Limiter
// records it) and the general one (the same Evaluation built without
// it), on two stores on one fake clock: spends within and beyond MaxCost,
// held spends, peeks, refunds (the general course on either), a priority
// class that holds capacity back, a lease's acquire and release, clocks
// that step back, new numbers and another algorithm under one revision.
// Every status, error and count of states must agree.
func TestShortMatchesGeneral(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	algs := []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA, sluice.Concurrency}
	for _, a := range algs {
		t.Run(a.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(a)))
			clock := sluicetest.NewClock()
			short := mustNew(t, Options{Clock: clock, SweepInterval: -1})
			general := mustNew(t, Options{Clock: clock, SweepInterval: -1})
			var p *sluice.Policy
			subject := ""
			now := clock.Now()
			taken := 0 // the decisions in the short form
			for step := range 4000 {
				switch {
				case step%400 == 0:
					p = draw.Policy(r, a, "fast", fastWindows)
					subject = fmt.Sprint("s.", step)
				case r.IntN(25) == 0:
					p = draw.Policy(r, a, "fast", fastWindows) // new numbers under the same revision
				case r.IntN(60) == 0:
					p = draw.Policy(r, algs[r.IntN(len(algs))], "fast", fastWindows) // another algorithm's state under it
				}
				now = now.Add(time.Duration(draw.Step(r, (p.Window+p.LeaseTTL).Microseconds())) * time.Microsecond)
				clock.Set(now)
				want := shortStep(r, subject, p)
				got := *want // copied before its form is recorded: want stays general
				form.Record(&got)
				if evaluation.Short(&got) {
					taken++
				}
				werr := general.Evaluate(context.Background(), want)
				gerr := short.Evaluate(context.Background(), &got)
				if fmt.Sprint(gerr) != fmt.Sprint(werr) || !slices.Equal(got.Statuses, want.Statuses) || got.Replayed != want.Replayed {
					t.Fatalf("seed %d step %d: %v cost %d hold %v class %q lease %q on %+v: short = %+v, %v; general = %+v, %v",
						seed, step, want.Op, want.Cost, want.Hold, want.Priority, want.LeaseID, *p, got.Statuses, gerr, want.Statuses, werr)
				}
				if short.Len() != general.Len() {
					t.Fatalf("seed %d step %d: the short course holds %d states, the general %d", seed, step, short.Len(), general.Len())
				}
			}
			if taken < 2000 {
				t.Fatalf("only %d of 4000 steps were in the short form", taken)
			}
		})
	}
}

// shortStep draws one decision on p for subject, in the general form:
// most of them of the short form's shape, some not.
func shortStep(r *rand.Rand, subject string, p *sluice.Policy) *sluice.Evaluation {
	ev := &sluice.Evaluation{Op: sluice.Spend, Subject: subject, Policies: []*sluice.Policy{p}, Cost: 1}
	if p.Algorithm == sluice.Concurrency {
		ev.Op, ev.LeaseID = sluice.Acquire, fmt.Sprint("lease-", r.IntN(4))
		switch r.IntN(6) {
		case 0, 1:
			ev.Op, ev.Cost = sluice.Release, 0
		case 2:
			ev.Op, ev.Cost = sluice.Renew, 0 // the general course on either
		case 3:
			ev.LeaseID = "" // refused on both
		}
	} else {
		switch r.IntN(12) {
		case 0, 1:
			ev.Op, ev.Cost = sluice.Peek, 0
		case 2:
			ev.Op = sluice.Refund
			if p.Algorithm == sluice.SlidingWindow {
				ev.Op = sluice.Spend
			}
		case 3:
			ev.Cost = p.MaxCost + int64(r.IntN(2)) // beyond it: refused on both
		case 4:
			ev.Cost = 1 + r.Int64N(min(p.MaxCost, 1000))
		case 5:
			ev.Hold = time.Duration(r.Int64N(p.Window.Microseconds()+2)) * time.Microsecond // some too long: refused on both
		case 6:
			ev.LeaseID = "stray" // refused on both
		}
	}
	if r.IntN(4) == 0 {
		ev.Priority = []string{"sheddable", "default", "other"}[r.IntN(3)]
	}
	return ev
}

// fastWindows are the windows of the drawn policies.
var fastWindows = []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, time.Hour}
