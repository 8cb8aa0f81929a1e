package sluicetest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// testPriorities: priority classes share one budget (issue 34). On a
// policy of 10 per second whose sheddable class may use 50 %, five
// sheddable spends are admitted (remaining 4 … 0 for that class), the
// sixth is denied with 0 remaining, and critical traffic is then admitted
// up to the full limit (remaining 4 … 0 of the whole), every algorithm and
// concurrency alike. A sheddable denial of a bucket waits exactly for its
// cost above the reserve (100ms at 10/s); a class no policy declares and
// a cost above the class's share are Incompatible, spending nothing.
// Under contention, 40 callers of both classes on a limit of 20 admit
// exactly 20, at most 10 of them sheddable.
func testPriorities(t *testing.T, newStore newStoreFunc) {
	shares := map[string]int{"critical": 100, "sheddable": 50}
	for _, a := range everyAlgorithm {
		t.Run("OneBudget/"+a.String(), func(t *testing.T) {
			p := policy("p", a, 10, time.Second, 0)
			p.Priorities = shares
			h := newHarness(t, newStore, p)
			for i := range 5 {
				if o := h.class("sheddable", 1); o.Kind != sluice.Allowed || o.Remaining != int64(4-i) {
					t.Fatalf("sheddable spend %d = %v, %d remaining (err %v), want allowed, %d remaining", i+1, o.Kind, o.Remaining, o.Err, 4-i)
				}
			}
			o := h.class("sheddable", 1)
			if o.Kind != sluice.Denied || o.Remaining != 0 || o.RetryAfter <= 0 {
				t.Fatalf("sixth sheddable spend = %v, %d remaining, retry %v, want denied, 0 remaining, a retry time", o.Kind, o.Remaining, o.RetryAfter)
			}
			if a == sluice.TokenBucket || a == sluice.GCRA {
				if o.RetryAfter != 100*time.Millisecond {
					t.Errorf("sixth sheddable spend: retry after %v, want 100ms (one unit above the reserve at 10/s)", o.RetryAfter)
				}
			}
			for i := range 5 {
				if o := h.class("critical", 1); o.Kind != sluice.Allowed || o.Remaining != int64(4-i) {
					t.Fatalf("critical spend %d after 5 sheddable = %v, %d remaining (err %v), want allowed, %d remaining", i+1, o.Kind, o.Remaining, o.Err, 4-i)
				}
			}
			if o := h.class("", 1); o.Kind != sluice.Denied {
				t.Fatalf("a spend of the default class on an exhausted budget = %v, want denied", o.Kind)
			}
		})
	}
	t.Run("OneBudget/concurrency", func(t *testing.T) {
		p := sluice.Policy{ID: "c", Algorithm: sluice.Concurrency, Limit: 4, LeaseTTL: time.Minute, Priorities: shares}
		h := newHarness(t, newStore, p)
		for i, class := range []string{"sheddable", "sheddable", "critical", "critical"} {
			o := h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Acquire, Policy: "c", Subject: h.subject, Priority: class})
			if o.Kind != sluice.Allowed {
				t.Fatalf("acquire %d (%s) = %v (err %v), want allowed", i+1, class, o.Kind, o.Err)
			}
			if i == 1 {
				if o := h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Acquire, Policy: "c", Subject: h.subject, Priority: "sheddable"}); o.Kind != sluice.Denied || o.Remaining != 0 {
					t.Fatalf("a third sheddable lease of 4 at 50 %% = %v, %d remaining, want denied, 0 remaining", o.Kind, o.Remaining)
				}
			}
		}
	})
	t.Run("Incompatible", func(t *testing.T) {
		p := policy("p", sluice.FixedWindow, 10, time.Second, 0)
		p.Priorities = shares
		h := newHarness(t, newStore, p)
		if o := h.class("bulk", 1); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
			t.Errorf("a class no policy declares = %v (%v), want Incompatible, ErrInvalidRequest", o.Kind, o.Err)
		}
		if o := h.class("sheddable", 6); o.Kind != sluice.Incompatible {
			t.Errorf("a sheddable cost of 6 where the class may use 5 = %v (%v), want Incompatible", o.Kind, o.Err)
		}
		if o := h.check("p", 0, true); o.Remaining != 10 {
			t.Errorf("peek after refused requests: %d remaining, want 10 (nothing spent)", o.Remaining)
		}
	})
	for _, a := range everyAlgorithm {
		t.Run("Contention/"+a.String(), func(t *testing.T) { testPriorityContention(t, newStore, a) })
	}
}

// testPriorityContention: 40 callers at once, half sheddable (50 %), half
// critical, on a limit of 20: exactly 20 admitted, at most 10 sheddable.
func testPriorityContention(t *testing.T, newStore newStoreFunc, a sluice.Algorithm) {
	const limit, callers = 20, 40
	p := policy("p", a, limit, time.Minute, 0)
	p.Priorities = map[string]int{"critical": 100, "sheddable": 50}
	h := newHarness(t, newStore, p)
	var admitted [2]atomic.Int64 // sheddable, critical
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan sluice.Outcome, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			class := []string{"sheddable", "critical"}[i%2]
			switch o := h.class(class, 1); o.Kind {
			case sluice.Allowed:
				admitted[i%2].Add(1)
			case sluice.Denied:
			default:
				errs <- o
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for o := range errs {
		t.Errorf("concurrent Check = %v (%v), want allowed or denied", o.Kind, o.Err)
	}
	shed, crit := admitted[0].Load(), admitted[1].Load()
	if shed > limit/2 || shed+crit != limit {
		t.Fatalf("%d callers: %d sheddable + %d critical admitted, want at most %d sheddable and exactly %d in all", callers, shed, crit, limit/2, limit)
	}
}

// class spends cost for h's subject on policy "p" as a request of class.
func (h *harness) class(class string, cost int64) sluice.Outcome {
	return h.limiter.Check(context.Background(), sluice.Request{Policy: "p", Subject: h.subject, Cost: cost, Priority: class})
}
