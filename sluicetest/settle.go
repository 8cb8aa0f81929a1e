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

// testSettleOwnPolicies: a settle is valid only for the policies its
// estimate spent, in the same order. An estimate of 5 on a and b, then a
// settle at 0 naming a and c (c spent to its limit), another number of
// policies, the same two in another order, or another subject, is
// Incompatible and writes nothing: c gets nothing back, a and b keep the
// estimate. The settle on a and b gives 5 back to both; a retry naming a
// and c is Incompatible too, not the first answer. An estimate whose
// deadline passed is refused and stays spent.
func testSettleOwnPolicies(t *testing.T, newStore newStoreFunc) {
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.TokenBucket, sluice.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			var ps []sluice.Policy
			for _, id := range []string{"a", "b", "c"} {
				p := policy(id, a, 10, time.Hour, 0)
				p.DedupeTTL = time.Minute
				ps = append(ps, p)
			}
			h := newHarness(t, newStore, ps...)
			do := func(subject string, op sluice.Op, cost int64, id string, policies ...string) sluice.Outcome {
				return h.limiter.Check(context.Background(), sluice.Request{Op: op, Policies: policies, Subject: subject, Cost: cost, EvaluationID: id})
			}
			left := func(id string) int64 { return h.check(id, 0, true).Remaining }
			expect(t, "spend c to its limit", h.check("c", 10, false), sluice.Allowed)
			expect(t, "estimate 5 on a, b", do(h.subject, sluice.Estimate, 5, "x", "a", "b"), sluice.Allowed)
			for _, bad := range []struct {
				what     string
				subject  string
				policies []string
			}{
				{"a and c", h.subject, []string{"a", "c"}},
				{"a alone", h.subject, []string{"a"}},
				{"a, b and c", h.subject, []string{"a", "b", "c"}},
				{"b and a", h.subject, []string{"b", "a"}},
				{"a and b of another subject", h.subject + ".other", []string{"a", "b"}},
			} {
				if o := do(bad.subject, sluice.Settle, 0, "x", bad.policies...); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
					t.Fatalf("settle at 0 naming %s after an estimate on a, b = %v (%v, %+v), want Incompatible with ErrInvalidRequest", bad.what, o.Kind, o.Err, o.Statuses)
				}
				if la, lb, lc := left("a"), left("b"), left("c"); la != 5 || lb != 5 || lc != 0 {
					t.Fatalf("after a settle naming %s: remaining a %d, b %d, c %d, want 5, 5, 0: a refused settle writes nothing", bad.what, la, lb, lc)
				}
			}
			if o := do(h.subject, sluice.Settle, 0, "x", "a", "b"); o.Kind != sluice.Allowed || len(o.Statuses) != 2 || o.Statuses[0].GivenBack != 5 || o.Statuses[1].GivenBack != 5 {
				t.Fatalf("settle at 0 on a, b = %v (%v, %+v), want 5 given back to each", o.Kind, o.Err, o.Statuses)
			}
			if o := do(h.subject, sluice.Settle, 0, "x", "a", "c"); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
				t.Fatalf("retried settle naming a and c = %v (%v, %+v), want Incompatible, not the first answer", o.Kind, o.Err, o.Statuses)
			}
			if lc := left("c"); lc != 0 {
				t.Fatalf("remaining c = %d after settles naming it, want 0: c was never estimated", lc)
			}
			expect(t, "estimate 4 on a, b", do(h.subject, sluice.Estimate, 4, "y", "a", "b"), sluice.Allowed)
			h.clock.Advance(time.Minute)
			if o := do(h.subject, sluice.Settle, 0, "y", "a", "b"); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
				t.Fatalf("settle past the estimate's deadline = %v (%v), want Incompatible", o.Kind, o.Err)
			}
			if la, lb := left("a"), left("b"); la > 6 || lb > 6 {
				t.Fatalf("after a settle past its deadline: remaining a %d, b %d, want at most 6: the estimate stays spent", la, lb)
			}
		})
	}
}
