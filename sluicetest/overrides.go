package sluicetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// testOverrides runs the override cases: a subject's numbers changed at
// run time keep its state, and every Limiter on a store that keeps
// overrides applies them.
func testOverrides(t *testing.T, newStore newStoreFunc) {
	t.Run("OverrideKeepsTheState", func(t *testing.T) {
		for _, a := range everyAlgorithm {
			if a == sluice.TokenBucket {
				continue
			}
			t.Run(a.String(), func(t *testing.T) { testOverrideKeepsState(t, newStore, a) })
		}
		t.Run("token_bucket", func(t *testing.T) { testOverrideTokenBucket(t, newStore) })
	})
	t.Run("OverrideConcurrency", func(t *testing.T) { testOverrideConcurrency(t, newStore) })
	t.Run("OverrideOnEveryLimiter", func(t *testing.T) { testOverrideShared(t, newStore) })
}

// setOverride sets o on h's limiter for h's subject.
func (h *harness) setOverride(o sluice.Override) {
	h.t.Helper()
	o.Subject = h.subject
	if err := h.limiter.SetOverride(context.Background(), o); err != nil {
		h.t.Fatalf("SetOverride(%+v): %v", o, err)
	}
}

// testOverrideKeepsState spends 80 of 100, raises the subject to 1000
// (920 left), spends 100 there, lowers it to 50 (denied: 180 spent),
// removes the override (100: still denied) and, for fixed_window, opens
// the next window.
func testOverrideKeepsState(t *testing.T, newStore newStoreFunc, a sluice.Algorithm) {
	h := newHarness(t, newStore, policy("plan", a, 100, time.Minute, 0))
	other := uniqueSubject(t, "other")
	expect(t, "spend 80 of 100", h.check("plan", 80, false), sluice.Allowed)
	h.setOverride(sluice.Override{Policy: "plan", Limit: 1000, Note: "raised"})
	h.run([]step{
		{"raised to 1000: 920 left", 0, "plan", 0, true, want{sluice.Allowed, 920, 0, h.resetAfter(a, 920, 1000)}},
		{"spend 100 under the override", 0, "plan", 100, false, want{sluice.Allowed, 820, 0, h.resetAfter(a, 820, 1000)}},
	})
	o := h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "plan", Subject: other})
	if o.Kind != sluice.Allowed || o.Limit != 100 || o.Remaining != 100 {
		t.Fatalf("another subject's peek = %+v (err %v), want the policy's own 100 of 100", o.Status, o.Err)
	}
	h.setOverride(sluice.Override{Policy: "plan", Limit: 50})
	if o := h.check("plan", 1, false); o.Kind != sluice.Denied || o.Remaining != 0 || o.Limit != 50 {
		t.Fatalf("lowered to 50 after 180 spent: Check = %+v (err %v), want denied, 0 of 50 left", o.Status, o.Err)
	}
	h.setOverride(sluice.Override{Policy: "plan"}) // Limit 0: removed
	if o := h.check("plan", 1, false); o.Kind != sluice.Denied || o.Remaining != 0 || o.Limit != 100 {
		t.Fatalf("override removed after 180 spent: Check = %+v (err %v), want denied, 0 of 100 left", o.Status, o.Err)
	}
	list, err := h.limiter.Overrides(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range list {
		if o.Subject == h.subject {
			t.Fatalf("Overrides after removal holds %+v, want none of this subject", o)
		}
	}
	if a == sluice.FixedWindow {
		h.clock.Advance(time.Minute)
		if o := h.check("plan", 1, false); o.Kind != sluice.Allowed || o.Remaining != 99 {
			t.Fatalf("next window: Check = %+v (err %v), want allowed, 99 left", o.Status, o.Err)
		}
	}
}

// testOverrideTokenBucket: a token bucket's state is the tokens left, and
// they carry over to new numbers (at most the new Burst): 20 of 100 left
// stay 20 of 1000, read as 10 of 10, and, peeks having written nothing,
// are 20 of 100 again when the override goes.
func testOverrideTokenBucket(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("plan", sluice.TokenBucket, 100, time.Minute, 0))
	expect(t, "spend 80 of 100", h.check("plan", 80, false), sluice.Allowed)
	h.setOverride(sluice.Override{Policy: "plan", Limit: 1000})
	h.run([]step{{"raised to 1000: the 20 tokens left stay", 0, "plan", 0, true, want{sluice.Allowed, 20, 0, 58800 * time.Millisecond}}})
	h.setOverride(sluice.Override{Policy: "plan", Limit: 10})
	h.run([]step{{"lowered to 10: a full bucket of 10", 0, "plan", 0, true, want{sluice.Allowed, 10, 0, 0}}})
	h.setOverride(sluice.Override{Policy: "plan"})
	h.run([]step{{"removed: 20 of 100", 0, "plan", 0, true, want{sluice.Allowed, 20, 0, 48 * time.Second}}})
}

// testOverrideConcurrency: a concurrency policy's override sets how many
// leases the subject holds at once; the leases held are kept.
func testOverrideConcurrency(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, leasePolicy("slots", 2, time.Minute))
	a := h.acquire("first of 2", sluice.Allowed, "slots")
	b := h.acquire("second of 2", sluice.Allowed, "slots")
	h.acquire("third of 2", sluice.Denied, "slots")
	h.setOverride(sluice.Override{Policy: "slots", Limit: 3})
	c := h.acquire("third, raised to 3", sluice.Allowed, "slots")
	h.setOverride(sluice.Override{Policy: "slots", Limit: 1})
	h.acquire("lowered to 1 with 3 held", sluice.Denied, "slots")
	for _, l := range []sluice.Lease{a.Lease, b.Lease} {
		if o := releaseLease(context.Background(), h.limiter, l); o.Kind != sluice.Allowed {
			t.Fatalf("Release under the override = %+v (err %v)", o, o.Err)
		}
	}
	h.acquire("lowered to 1 with 1 held", sluice.Denied, "slots")
	h.release("the last one", c.Lease, 1)
	h.acquire("lowered to 1 with none held", sluice.Allowed, "slots")
	h.setOverride(sluice.Override{Policy: "slots"})
	h.acquire("back to 2 with 1 held", sluice.Allowed, "slots")
}

// resetAfter is when a's state of limit units per minute with left of
// them left at the harness's instant equals absent.
func (h *harness) resetAfter(a sluice.Algorithm, left, limit int64) time.Duration {
	switch a {
	case sluice.GCRA:
		return time.Duration(limit-left) * time.Minute / time.Duration(limit)
	case sluice.SlidingWindow:
		return 2 * time.Minute // the current window's count weighs until the next one closes
	}
	return time.Minute
}

// testOverrideShared sets an override through one Limiter and has a
// second Limiter on the same store read it and apply it, when the store
// keeps overrides.
func testOverrideShared(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("plan", sluice.FixedWindow, 10, time.Minute, 0))
	if _, ok := h.store.(interface {
		Overrides(context.Context) ([]sluice.Override, error)
	}); !ok {
		t.Skip("the store does not keep overrides: each Limiter keeps its own")
	}
	second, err := sluice.New(h.store, []sluice.Policy{policy("plan", sluice.FixedWindow, 10, time.Minute, 0)}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "spend 8 of 10", h.check("plan", 8, false), sluice.Allowed)
	h.setOverride(sluice.Override{Policy: "plan", Limit: 100, Note: "tenant plan"})
	peek := func() sluice.Outcome {
		return second.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "plan", Subject: h.subject})
	}
	if err := readUntil(second, func() bool { return peek().Limit == 100 }); err != nil {
		t.Fatalf("the second Limiter's peek = %+v: %v", peek().Status, err)
	}
	if o := peek(); o.Kind != sluice.Allowed || o.Remaining != 92 {
		t.Fatalf("the second Limiter's peek = %+v (err %v), want 92 of 100 left", o.Status, o.Err)
	}
	list, err := second.Overrides(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var found []sluice.Override
	for _, o := range list {
		if o.Subject == h.subject {
			found = append(found, o)
		}
	}
	if len(found) != 1 || found[0] != (sluice.Override{Policy: "plan", Subject: h.subject, Limit: 100, Note: "tenant plan"}) {
		t.Fatalf("second.Overrides holds %+v of this subject, want the one override", found)
	}
	h.setOverride(sluice.Override{Policy: "plan"})
	if err := readUntil(second, func() bool { return peek().Limit == 10 }); err != nil {
		t.Fatalf("after removal the second Limiter's peek = %+v: %v", peek().Status, err)
	}
}

// readUntil has l read the store's overrides (Limiter.Overrides, which
// applies what it reads) until cond holds, 100 reads at most: no sleep on
// the real clock, on which a Limiter's own background reads run. A read
// l began in the background before the change may land after one of
// these, hence more than one.
func readUntil(l *sluice.Limiter, cond func() bool) error {
	for range 100 {
		if _, err := l.Overrides(context.Background()); err != nil {
			return err
		}
		if cond() {
			return nil
		}
	}
	return errors.New("not after 100 reads of the store's overrides")
}
