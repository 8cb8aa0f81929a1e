package sluicetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// testSettle: an estimate of 4 of 10 settled at 1 gives 3 back, and a
// retried settle answers the same, Replayed, and changes nothing; an
// estimate of 5 settled at 12 charges 7 past the limit, leaving 3 owed
// and nothing remaining; a settle with no estimate, and an estimate on
// sliding_window or concurrency, are Incompatible.
func testSettle(t *testing.T, newStore newStoreFunc) {
	for _, a := range append(everyAlgorithm, sluice.Concurrency) {
		t.Run(a.String(), func(t *testing.T) {
			p := policy("p", a, 10, time.Minute, 0)
			p.DedupeTTL = time.Minute
			if a == sluice.Concurrency {
				p.Window, p.LeaseTTL = 0, time.Minute
			}
			h := newHarness(t, newStore, p)
			do := func(op sluice.Op, cost int64, id string) sluice.Outcome {
				return h.limiter.Check(context.Background(), sluice.Request{Op: op, Policy: "p", Subject: h.subject, Cost: cost, EvaluationID: id})
			}
			if a == sluice.SlidingWindow || a == sluice.Concurrency {
				if o := do(sluice.Estimate, 1, "x"); o.Kind != sluice.Incompatible {
					t.Fatalf("estimate on %v = %+v, want Incompatible", a, o)
				}
				return
			}
			if o := do(sluice.Settle, 1, "never"); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
				t.Fatalf("settle with no estimate = %+v, want Incompatible with ErrInvalidRequest", o)
			}
			expect(t, "estimate 4", do(sluice.Estimate, 4, "a"), sluice.Allowed)
			o := do(sluice.Settle, 1, "a")
			if o.Kind != sluice.Allowed || o.GivenBack != 3 || o.Charged != 0 || o.Remaining != 9 || o.Replayed {
				t.Fatalf("settle 4 → 1 = %+v, want allowed, 3 given back, 9 remaining", o)
			}
			if again := do(sluice.Settle, 7, "a"); !again.Replayed || again.Status != o.Status {
				t.Fatalf("retried settle = %+v, want the first answer %+v, replayed", again, o.Status)
			}
			if got := h.check("p", 0, true).Remaining; got != 9 {
				t.Fatalf("remaining after a retried settle = %d, want 9: settled once", got)
			}
			expect(t, "estimate 5", do(sluice.Estimate, 5, "b"), sluice.Allowed)
			if o := do(sluice.Settle, 12, "b"); o.Charged != 7 || o.Owed != 3 || o.Remaining != 0 {
				t.Fatalf("settle 5 → 12 with 4 left = %+v, want 7 charged, 3 owed, nothing remaining", o)
			}
			expect(t, "a spend in debt", h.check("p", 1, false), sluice.Denied)
		})
	}
	t.Run("fixed_window/month", func(t *testing.T) { testSettlePeriod(t, newStore) })
}

// testSettlePeriod: on "100 a month" in Europe/Berlin, an estimate of 60
// settled at 20 in its month gives 40 back; an estimate of 50 spent in
// March and settled at 90 in April gives nothing back (March took its
// budget) and charges the 40 in April; an estimate of 50 settled at 120
// charges 70, 60 past April's limit; a retried settle answers the same.
func testSettlePeriod(t *testing.T, newStore newStoreFunc) {
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, newStore, sluice.Policy{ID: "plan", Algorithm: sluice.FixedWindow, Limit: 100, Period: "month", TimeZone: loc, DedupeTTL: time.Hour})
	do := func(op sluice.Op, cost int64, id string) sluice.Outcome {
		return h.limiter.Check(context.Background(), sluice.Request{Op: op, Policy: "plan", Subject: h.subject, Cost: cost, EvaluationID: id})
	}
	april, may := time.Date(2026, 4, 1, 0, 0, 0, 0, loc), time.Date(2026, 5, 1, 0, 0, 0, 0, loc)
	h.clock.Set(time.Date(2026, 3, 31, 23, 0, 0, 0, loc))
	expect(t, "estimate 60", do(sluice.Estimate, 60, "a"), sluice.Allowed)
	h.clock.Set(time.Date(2026, 3, 31, 23, 10, 0, 0, loc))
	if o := do(sluice.Settle, 20, "a"); o.GivenBack != 40 || o.Remaining != 80 || o.ResetAfter != 50*time.Minute {
		t.Fatalf("settle 60 → 20 in March = %+v, want 40 given back, 80 remaining, reset at April", o)
	}
	expect(t, "estimate 50", do(sluice.Estimate, 50, "b"), sluice.Allowed)
	h.clock.Set(april.Add(5 * time.Minute)) // within the estimate's deadline, an hour
	first := do(sluice.Settle, 90, "b")
	if first.GivenBack != 0 || first.Charged != 40 || first.Remaining != 60 || first.ResetAfter != may.Sub(april.Add(5*time.Minute)) {
		t.Fatalf("settle 50 → 90 in April = %+v, want 40 charged in April, 60 remaining until May", first)
	}
	if again := do(sluice.Settle, 1, "b"); !again.Replayed || again.Status != first.Status {
		t.Fatalf("retried settle = %+v, want the first answer %+v, replayed", again, first.Status)
	}
	expect(t, "estimate 50 in April", do(sluice.Estimate, 50, "c"), sluice.Allowed)
	if o := do(sluice.Settle, 120, "c"); o.Charged != 70 || o.Owed != 60 || o.Remaining != 0 {
		t.Fatalf("settle 50 → 120 with 10 left = %+v, want 70 charged, 60 owed", o)
	}
	expect(t, "a spend in debt", h.check("plan", 1, false), sluice.Denied)
	h.clock.Set(may)
	expect(t, "May: afresh", h.check("plan", 100, false), sluice.Allowed)
}
