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
}
