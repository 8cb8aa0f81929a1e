package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// testSemantics runs the exactly-once, refund and policy-change scenarios.
func testSemantics(t *testing.T, newStore newStoreFunc) {
	t.Run("RetryWithSameIDSpendsOnce", func(t *testing.T) { testDedupe(t, newStore) })
	t.Run("DedupeForgetsAfterTTL", func(t *testing.T) { testDedupeTTL(t, newStore) })
	t.Run("DedupeEvictsOldestFirst", func(t *testing.T) { testDedupeCap(t, newStore) })
	t.Run("DedupeMultiPolicy", func(t *testing.T) { testDedupeMulti(t, newStore) })
	t.Run("Refund", func(t *testing.T) { testRefund(t, newStore) })
	t.Run("EstimateThenSettle", func(t *testing.T) { testSettle(t, newStore) })
	t.Run("SettleNamesItsEstimatesPolicies", func(t *testing.T) { testSettleOwnPolicies(t, newStore) })
	t.Run("LoweredPolicySameRevision", func(t *testing.T) { testLoweredPolicy(t, newStore) })
	t.Run("ChangedWindowSameRevision", func(t *testing.T) { testChangedWindow(t, newStore) })
}

func (h *harness) checkID(policy string, cost int64, id string) sluice.Outcome {
	return h.limiter.Check(context.Background(), sluice.Request{Policy: policy, Subject: h.subject, Cost: cost, EvaluationID: id})
}

func testDedupe(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("p", a, 5, time.Minute, 0))
			first := h.checkID("p", 2, "req-1")
			if first.Kind != sluice.Allowed || first.Replayed {
				t.Fatalf("first = %+v, want allowed, not replayed", first)
			}
			h.clock.Advance(time.Second)
			retry := h.checkID("p", 2, "req-1")
			if !retry.Replayed || retry.Kind != first.Kind || retry.Status != first.Status {
				t.Fatalf("retry with the same id = %+v, want the first decision %+v replayed", retry, first)
			}
			if got := h.check("p", 0, true).Remaining; got != 3 {
				t.Fatalf("remaining after a spend and its retry = %d, want 3 (one spend of 2)", got)
			}
			// A denial is remembered too: the same id is not re-decided.
			expect(t, "spend the rest", h.checkID("p", 3, "req-2"), sluice.Allowed)
			denied := h.checkID("p", 1, "req-3")
			expect(t, "over the limit", denied, sluice.Denied)
			if again := h.checkID("p", 1, "req-3"); !again.Replayed || again.Kind != sluice.Denied {
				t.Fatalf("retry of a denial = %+v, want the denial replayed", again)
			}
			// Peeks are never remembered and never replayed.
			if o := h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "p", Subject: h.subject, EvaluationID: "req-1"}); o.Replayed {
				t.Fatalf("peek with a used id = %+v, want a fresh look", o)
			}
		})
	}
}

func testDedupeTTL(t *testing.T, newStore newStoreFunc) {
	p := policy("p", sluice.GCRA, 10, time.Minute, 0)
	p.DedupeTTL = 2 * time.Second
	h := newHarness(t, newStore, p)
	expect(t, "first", h.checkID("p", 1, "id"), sluice.Allowed)
	h.clock.Advance(2*time.Second - time.Millisecond)
	if o := h.checkID("p", 1, "id"); !o.Replayed {
		t.Fatalf("retry 1ms before the dedupe TTL = %+v, want replayed", o)
	}
	h.clock.Advance(time.Millisecond)
	if o := h.checkID("p", 1, "id"); o.Replayed || o.Kind != sluice.Allowed {
		t.Fatalf("same id at the dedupe TTL = %+v, want a new decision", o)
	}
	if got := h.check("p", 0, true).Remaining; got != 8 {
		t.Fatalf("remaining = %d, want 8: the id counted again after its TTL", got)
	}
}

func testDedupeCap(t *testing.T, newStore newStoreFunc) {
	p := policy("p", sluice.FixedWindow, 100, time.Minute, 0)
	p.DedupeMax = 3
	h := newHarness(t, newStore, p)
	for _, id := range []string{"a", "b", "c", "d"} {
		expect(t, "spend "+id, h.checkID("p", 1, id), sluice.Allowed)
		h.clock.Advance(time.Millisecond)
	}
	for _, id := range []string{"b", "c", "d"} {
		if o := h.checkID("p", 1, id); !o.Replayed {
			t.Fatalf("retry of %q (among the 3 newest) = %+v, want replayed", id, o)
		}
	}
	if o := h.checkID("p", 1, "a"); o.Replayed {
		t.Fatalf("retry of \"a\", the oldest of 4 with a cap of 3 = %+v, want forgotten and decided again", o)
	}
	if got := h.check("p", 0, true).Remaining; got != 95 {
		t.Fatalf("remaining = %d, want 95 (a, b, c, d, and a again)", got)
	}
}

func testDedupeMulti(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("a", sluice.FixedWindow, 3, time.Minute, 0), policy("b", sluice.TokenBucket, 1, time.Second, 5))
	req := sluice.Request{Policies: []string{"a", "b"}, Subject: h.subject, Cost: 2, EvaluationID: "m"}
	first := h.limiter.Check(context.Background(), req)
	retry := h.limiter.Check(context.Background(), req)
	if !retry.Replayed || len(retry.Statuses) != 2 || retry.Statuses[0] != first.Statuses[0] || retry.Statuses[1] != first.Statuses[1] {
		t.Fatalf("multi-policy retry = %+v, want %+v replayed", retry, first)
	}
	if a, b := h.check("a", 0, true).Remaining, h.check("b", 0, true).Remaining; a != 1 || b != 3 {
		t.Fatalf("remaining after a multi-policy spend and its retry = %d, %d; want 1, 3", a, b)
	}
}

func testRefund(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("p", a, 5, time.Minute, 0))
			refund := func(cost int64, id string) sluice.Outcome {
				return h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Refund, Policy: "p", Subject: h.subject, Cost: cost, EvaluationID: id})
			}
			if a == sluice.SlidingWindow || a == sluice.Concurrency {
				o := refund(1, "")
				if o.Kind != sluice.Incompatible || !errors.Is(o.Err, algorithm.ErrNotRefundable) {
					t.Fatalf("refund on %v = %+v, want Incompatible with ErrNotRefundable", a, o)
				}
				return
			}
			expect(t, "spend 4", h.checkID("p", 4, "job"), sluice.Allowed)
			o := refund(3, "job")
			if o.Kind != sluice.Allowed || o.Remaining != 4 || o.Replayed {
				t.Fatalf("refund of 3 after spending 4 of 5 with the same id = %+v, want allowed, remaining 4: refunds and spends are remembered apart", o)
			}
			if again := refund(3, "job"); !again.Replayed || again.Remaining != 4 {
				t.Fatalf("retried refund = %+v, want replayed, remaining 4", again)
			}
			if got := h.check("p", 0, true).Remaining; got != 4 {
				t.Fatalf("remaining after a retried refund = %d, want 4: refunded once", got)
			}
			if o := refund(5, ""); o.Remaining != 5 {
				t.Fatalf("refund of more than was spent = %+v, want remaining capped at the limit 5", o)
			}
		})
	}
}

func testLoweredPolicy(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("p", a, 20, time.Minute, 0))
			expect(t, "spend 15", h.check("p", 15, false), sluice.Allowed)
			lowered, err := sluice.New(h.store, []sluice.Policy{policy("p", a, 4, 30*time.Second, 0)}, sluice.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 8; i++ {
				o := lowered.Check(context.Background(), sluice.Request{Policy: "p", Subject: h.subject})
				if (o.Kind != sluice.Allowed && o.Kind != sluice.Denied) || o.Remaining < 0 || o.Remaining > 4 || (o.Kind == sluice.Denied) != (o.RetryAfter > 0) {
					t.Fatalf("step %d under the lowered policy: %+v (err %v), want a decision with 0 ≤ remaining ≤ 4", i, o, o.Err)
				}
				h.clock.Advance(10 * time.Second)
			}
		})
	}
}

// testChangedWindow spends 5 of 10 under one window, then reads the state
// under another window of the same revision, at the same instant: every
// algorithm carries the 5 units over (bucket states as whole units).
func testChangedWindow(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		for _, c := range []struct{ from, to time.Duration }{{time.Minute, time.Second}, {time.Second, time.Minute}} {
			t.Run(fmt.Sprintf("%v/%v-to-%v", a, c.from, c.to), func(t *testing.T) {
				h := newHarness(t, newStore, policy("p", a, 10, c.from, 0))
				expect(t, "spend 5", h.check("p", 5, false), sluice.Allowed)
				changed, err := sluice.New(h.store, []sluice.Policy{policy("p", a, 10, c.to, 0)}, sluice.Options{})
				if err != nil {
					t.Fatal(err)
				}
				o := changed.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "p", Subject: h.subject})
				if o.Kind != sluice.Allowed || o.Remaining != 5 {
					t.Fatalf("5 of 10 spent per %v, read per %v = %+v (err %v), want 5 remaining: numbers changed under one revision carry the state over", c.from, c.to, o, o.Err)
				}
			})
		}
	}
}
