package sluicetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// testBook: a store books slots (sluice.Book, Evaluation.MaxWait). On
// gcra or token_bucket at 10/s, burst 2, bookings at one instant are
// admitted at once twice, then with Delay 100ms, 200ms; one whose slot
// lies past its MaxWait (250ms) is Denied, Retry-After 300ms, and books
// nothing (the next with room takes that slot); a spend at the first
// booked slot's time is Denied (it is taken). 20 bookings sent at once
// each get a slot of their own. A book on fixed_window, or with a max
// wait of a fraction of a µs, is refused as invalid.
func testBook(t *testing.T, newStore newStoreFunc) {
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("book", a, 10, time.Second, 2))
			book := func(maxWait time.Duration) sluice.Outcome {
				return h.limiter.Check(ctx, sluice.Request{Op: sluice.Book, Policy: "book", Subject: h.subject, MaxWait: maxWait})
			}
			for i, want := range []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond} {
				if o := book(250 * time.Millisecond); o.Kind != sluice.Allowed || o.Delay != want {
					t.Fatalf("Book %d at one instant = %+v (err %v), want allowed, delay %v", i, o.Status, o.Err, want)
				}
			}
			if o := book(250 * time.Millisecond); o.Kind != sluice.Denied || o.RetryAfter != 300*time.Millisecond || o.Delay != 0 {
				t.Fatalf("Book past its max wait = %+v, want denied, retry after 300ms", o.Status)
			}
			if o := book(300 * time.Millisecond); o.Kind != sluice.Allowed || o.Delay != 300*time.Millisecond {
				t.Fatalf("Book with room for the next slot = %+v, want allowed, delay 300ms: the denial booked nothing", o.Status)
			}
			h.clock.Advance(100 * time.Millisecond)
			if o := h.check("book", 1, false); o.Kind != sluice.Denied {
				t.Fatalf("spend at the first booked slot = %+v, want denied: the slot is taken", o.Status)
			}
		})
	}
	t.Run("concurrent", func(t *testing.T) {
		p := policy("book", sluice.GCRA, 10, time.Second, 1)
		p.MaxWait = 10 * time.Second // the bound is the policy's: a request may ask for less, never more
		h := newHarness(t, newStore, p)
		const n = 20
		delays := make([]time.Duration, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := h.limiter.Check(ctx, sluice.Request{Op: sluice.Book, Policy: "book", Subject: h.subject, MaxWait: 10 * time.Second})
				delays[i] = o.Delay
				if o.Kind != sluice.Allowed {
					delays[i] = -1
				}
			}()
		}
		wg.Wait()
		slices.Sort(delays)
		for i, d := range delays {
			if d != time.Duration(i)*100*time.Millisecond {
				t.Fatalf("%d bookings at once got delays %v, want each slot 100ms apart once", n, delays)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		fw := evaluation.Defaults(policy("fw", sluice.FixedWindow, 10, time.Second, 0))
		g := evaluation.Defaults(policy("g", sluice.GCRA, 10, time.Second, 2))
		h := newHarness(t, newStore, fw, g)
		for _, ev := range []*sluice.Evaluation{
			{Op: sluice.Book, Subject: h.subject, Policies: []*sluice.Policy{&fw}, Cost: 1, MaxWait: time.Second},
			{Op: sluice.Book, Subject: h.subject, Policies: []*sluice.Policy{&g}, Cost: 1, MaxWait: time.Millisecond + time.Nanosecond},
			{Op: sluice.Spend, Subject: h.subject, Policies: []*sluice.Policy{&g}, Cost: 1, MaxWait: time.Second},
		} {
			if err := h.store.Evaluate(ctx, ev); !errors.Is(err, sluice.ErrInvalidRequest) {
				t.Errorf("Evaluate(%v on %s, max wait %v) = %v, want ErrInvalidRequest", ev.Op, ev.Policies[0].ID, ev.MaxWait, err)
			}
		}
		if o := h.check("g", 0, true); o.Remaining != 2 {
			t.Errorf("peek after refused bookings: %d remaining, want 2 (nothing spent)", o.Remaining)
		}
	})
}
