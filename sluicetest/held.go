package sluicetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// testHeld: a store passes a held spend (Evaluation.Hold) through to the
// engine. On gcra or token_bucket at 10/s, burst 10, a fresh subject's
// held spend of 5 for 300ms is allowed with 2 remaining (10, less 3 for
// what the rate would refill during the hold, less 5), and a plain spend
// right after, by the Limiter, sees 1. A held spend where none is offered
// (sliding_window), for longer than the rules allow or of a fraction of a
// microsecond is refused as invalid and spends nothing.
func testHeld(t *testing.T, newStore newStoreFunc) {
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		t.Run(a.String(), func(t *testing.T) {
			p := evaluation.Defaults(policy("held", a, 10, time.Second, 10))
			h := newHarness(t, newStore, p)
			ev := &sluice.Evaluation{Op: sluice.Spend, Subject: h.subject, Policies: []*sluice.Policy{&p}, Cost: 5, Hold: 300 * time.Millisecond}
			if err := h.store.Evaluate(ctx, ev); err != nil {
				t.Fatalf("Evaluate(cost=5, hold=300ms): %v", err)
			}
			if st := ev.Statuses[0]; !st.Allowed || st.Remaining != 2 || st.ResetAfter != 800*time.Millisecond {
				t.Fatalf("Evaluate(cost=5, hold=300ms) on a fresh subject = %+v, want allowed, 2 remaining, reset after 800ms", st)
			}
			if o := h.check("held", 1, false); o.Kind != sluice.Allowed || o.Remaining != 1 {
				t.Fatalf("Check(%q, cost=1) right after the held spend = %+v (err %v), want allowed, 1 remaining", "held", o.Status, o.Err)
			}
			for _, bad := range []time.Duration{1100 * time.Millisecond, time.Millisecond + time.Nanosecond, -time.Millisecond} {
				ev := &sluice.Evaluation{Op: sluice.Spend, Subject: h.subject, Policies: []*sluice.Policy{&p}, Cost: 1, Hold: bad}
				if err := h.store.Evaluate(ctx, ev); !errors.Is(err, sluice.ErrInvalidRequest) {
					t.Errorf("Evaluate(cost=1, hold=%v) = %v, want ErrInvalidRequest", bad, err)
				}
			}
			if o := h.check("held", 0, true); o.Remaining != 1 {
				t.Errorf("peek after refused held spends: %d remaining, want 1 (nothing spent)", o.Remaining)
			}
		})
	}
	t.Run("sliding_window", func(t *testing.T) {
		p := evaluation.Defaults(policy("estimate", sluice.SlidingWindow, 10, time.Second, 0))
		h := newHarness(t, newStore, p)
		ev := &sluice.Evaluation{Op: sluice.Spend, Subject: h.subject, Policies: []*sluice.Policy{&p}, Cost: 1, Hold: 100 * time.Millisecond}
		if err := h.store.Evaluate(ctx, ev); !errors.Is(err, sluice.ErrInvalidRequest) {
			t.Fatalf("Evaluate(cost=1, hold=100ms) on sliding_window = %v, want ErrInvalidRequest", err)
		}
		if o := h.check("estimate", 0, true); o.Remaining != 10 {
			t.Errorf("peek after a refused held spend: %d remaining, want 10 (nothing spent)", o.Remaining)
		}
	})
}
