package sluicetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// testConcurrency runs the scenarios of concurrency policies.
func testConcurrency(t *testing.T, newStore newStoreFunc) {
	t.Run("ConcurrencyLeases", func(t *testing.T) { testLeases(t, newStore) })
	t.Run("ConcurrencyExactlyLimit", func(t *testing.T) { testLeasesConcurrent(t, newStore) })
	t.Run("ConcurrencyWithRate", func(t *testing.T) { testLeasesWithRate(t, newStore) })
	t.Run("ConcurrencyRenew", func(t *testing.T) { testLeaseRenew(t, newStore) })
	t.Run("ConcurrencyReplayNamesTheSameLease", func(t *testing.T) { testLeaseReplay(t, newStore) })
	t.Run("ConcurrencyKeyRotationCarriesLeases", func(t *testing.T) { testLeaseKeyRotation(t, newStore) })
}

// leasePolicy is "at most limit at once, a lease lives ttl".
func leasePolicy(id string, limit int64, ttl time.Duration) sluice.Policy {
	return sluice.Policy{ID: id, Algorithm: sluice.Concurrency, Limit: limit, LeaseTTL: ttl}
}

// acquire checks policy for h's subject and fails unless the outcome has
// kind k (and, allowed, a lease).
func (h *harness) acquire(what string, k sluice.Kind, policies ...string) sluice.Outcome {
	h.t.Helper()
	o := h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Acquire, Policies: policies, Subject: h.subject})
	expect(h.t, what, o, k)
	if k == sluice.Allowed && (o.Lease.ID == "" || o.Lease.Subject != h.subject) {
		h.t.Fatalf("%s: Check(%v) = %+v, want a lease for %q", what, policies, o, h.subject)
	}
	return o
}

// releaseLease gives lease back through l: a Check of a Release.
func releaseLease(ctx context.Context, l *sluice.Limiter, lease sluice.Lease) sluice.Outcome {
	return l.Check(ctx, sluice.Request{Op: sluice.Release, Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID})
}

// release gives lease back and fails unless it is Allowed with remaining
// slots left on its first policy.
func (h *harness) release(what string, lease sluice.Lease, remaining int64) {
	h.t.Helper()
	o := releaseLease(context.Background(), h.limiter, lease)
	if o.Kind != sluice.Allowed || o.Remaining != remaining {
		h.t.Fatalf("%s: Release(%+v) = %+v (err %v), want allowed with %d remaining", what, lease, o.Status, o.Err, remaining)
	}
}

// testLeases: 2 at once with a 10s TTL: the third waits for the soonest
// expiry; a release frees a slot; releasing twice, after expiry or an
// unknown lease is harmless; a holder that dies (never releases) gives its
// slot back when its lease expires.
func testLeases(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, leasePolicy("c", 2, 10*time.Second))
	a := h.acquire("first", sluice.Allowed, "c")
	if a.Remaining != 1 || a.ResetAfter != 10*time.Second || len(a.Lease.Policies) != 1 || a.Lease.Policies[0] != "c" {
		t.Fatalf("first lease = %+v, want 1 remaining, reset after 10s, held on [c]", a)
	}
	h.clock.Advance(time.Second)
	b := h.acquire("second", sluice.Allowed, "c")
	if b.Lease.ID == a.Lease.ID {
		t.Fatalf("two leases named alike: %q", a.Lease.ID)
	}
	h.clock.Advance(time.Second)
	o := h.acquire("third", sluice.Denied, "c")
	if o.RetryAfter != 8*time.Second || o.Remaining != 0 || o.Lease.ID != "" {
		t.Fatalf("third = %+v, want denied, retry after 8s (the first lease's expiry), no lease", o)
	}
	h.release("release the first", a.Lease, 1)
	h.release("release it again", a.Lease, 1)
	h.release("release a lease never acquired", sluice.Lease{ID: "never-acquired", Subject: h.subject, Policies: []string{"c"}}, 1)
	if o := releaseLease(context.Background(), h.limiter, sluice.Lease{}); o.Kind != sluice.Allowed {
		t.Fatalf("Release of the zero Lease = %+v, want allowed", o)
	}
	c := h.acquire("third after the release", sluice.Allowed, "c")
	h.acquire("fourth", sluice.Denied, "c")
	// The holders of b and c die: nothing is released. b's slot is back
	// 10s after it was taken, c's 10s after that.
	h.clock.Advance(9*time.Second - time.Microsecond)
	h.acquire("1µs before b's lease expires", sluice.Denied, "c")
	h.clock.Advance(time.Microsecond)
	d := h.acquire("when b's lease expires", sluice.Allowed, "c")
	h.release("release after expiry", b.Lease, 0)
	h.release("release d", d.Lease, 1)
	h.clock.Advance(time.Hour)
	h.release("release long after expiry", c.Lease, 2)
	h.acquire("all back", sluice.Allowed, "c")
}

// testLeasesConcurrent: 200 concurrent acquirers of "5 at once": exactly 5
// hold a lease; after they release, 5 more.
func testLeasesConcurrent(t *testing.T, newStore newStoreFunc) {
	const limit, callers = 5, 200
	h := newHarness(t, newStore, leasePolicy("c", limit, time.Minute))
	round := func() []sluice.Lease {
		var mu sync.Mutex
		var held []sluice.Lease
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				o := h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Acquire, Policy: "c", Subject: h.subject})
				switch o.Kind {
				case sluice.Allowed:
					mu.Lock()
					held = append(held, o.Lease)
					mu.Unlock()
				case sluice.Denied:
				default:
					t.Errorf("concurrent acquire = %v (%v), want allowed or denied", o.Kind, o.Err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if len(held) != limit {
			t.Fatalf("%d concurrent acquirers: %d leases, want exactly %d", callers, len(held), limit)
		}
		return held
	}
	for i, l := range round() {
		h.release("release", l, int64(i+1))
	}
	round()
}

// peekRemaining returns policy's Remaining now, for h's subject.
func (h *harness) peekRemaining(policy string) int64 {
	return h.check(policy, 0, true).Remaining
}

// testLeasesWithRate: "10 per minute and at most 2 at once", in one
// request, all or nothing: a denial by either spends on neither.
func testLeasesWithRate(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("rate", sluice.FixedWindow, 3, time.Minute, 0), leasePolicy("conc", 2, time.Minute))
	a := h.acquire("first", sluice.Allowed, "rate", "conc")
	if a.Lease.Policies[0] != "conc" || len(a.Lease.Policies) != 1 || len(a.Statuses) != 2 {
		t.Fatalf("first = %+v, want a lease on [conc] only and 2 statuses", a)
	}
	b := h.acquire("second", sluice.Allowed, "rate", "conc")
	o := h.acquire("third: two held", sluice.Denied, "rate", "conc")
	if o.Policy != "conc" || !o.Statuses[0].Allowed || o.Statuses[0].Remaining != 1 {
		t.Fatalf("third = %+v, want denied by conc, rate unspent (1 remaining)", o)
	}
	h.release("release the first", a.Lease, 1)
	h.acquire("third after a release", sluice.Allowed, "rate", "conc")
	h.release("release the second", b.Lease, 1)
	// The rate is spent (3 of 3); conc has a slot but must not lose it.
	o = h.acquire("fourth: rate spent", sluice.Denied, "rate", "conc")
	if o.Policy != "rate" || h.peekRemaining("conc") != 1 {
		t.Fatalf("fourth = %+v, want denied by rate, no lease taken on conc (1 remaining, now %d)", o, h.peekRemaining("conc"))
	}
	// A cost above conc's limit is fine: a lease is one slot.
	h.clock.Advance(time.Minute)
	o = h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Acquire, Policies: []string{"rate", "conc"}, Subject: h.subject, Cost: 3})
	expect(t, "cost 3 with \"at most 2 at once\"", o, sluice.Allowed)
	// A release names concurrency policies only.
	o = releaseLease(context.Background(), h.limiter, sluice.Lease{ID: o.Lease.ID, Subject: h.subject, Policies: []string{"rate", "conc"}})
	if o.Kind != sluice.Incompatible {
		t.Fatalf("Release naming a rate policy = %+v, want incompatible", o)
	}
	// A spend does not take a lease: acquire does.
	o = h.limiter.Check(context.Background(), sluice.Request{Policies: []string{"rate", "conc"}, Subject: h.subject})
	if o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
		t.Fatalf("spend on a concurrency policy = %+v, want incompatible", o)
	}
	// A refund does not give back a lease.
	o = h.limiter.Check(context.Background(), sluice.Request{Op: sluice.Refund, Policy: "conc", Subject: h.subject})
	if o.Kind != sluice.Incompatible {
		t.Fatalf("refund on a concurrency policy = %+v, want incompatible", o)
	}
}

// testLeaseRenew: a renewed lease outlives its first TTL; an expired one
// is acquired afresh when a slot is free, denied when none is.
func testLeaseRenew(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, leasePolicy("c", 1, 10*time.Second))
	a := h.acquire("first", sluice.Allowed, "c")
	h.clock.Advance(8 * time.Second)
	if o := renew(h.limiter, a.Lease); o.Kind != sluice.Allowed || o.ResetAfter != 10*time.Second || o.Lease.ID != a.Lease.ID {
		t.Fatalf("Renew = %+v, want allowed, reset after 10s, the same lease", o)
	}
	h.clock.Advance(8 * time.Second)
	h.acquire("16s after the first: renewed, still held", sluice.Denied, "c")
	h.clock.Advance(2 * time.Second)
	b := h.acquire("after the renewed lease expired", sluice.Allowed, "c")
	if o := renew(h.limiter, a.Lease); o.Kind != sluice.Denied {
		t.Fatalf("Renew of an expired lease with the slot taken = %+v, want denied", o)
	}
	h.release("release b", b.Lease, 1)
	if o := renew(h.limiter, a.Lease); o.Kind != sluice.Allowed || o.Remaining != 0 {
		t.Fatalf("Renew of an expired lease with a free slot = %+v, want allowed, acquired afresh", o)
	}
}

// testLeaseReplay: a retry with the same EvaluationID gets the first
// decision and names the lease the first acquired, so releasing it
// releases the right one.
func testLeaseReplay(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, leasePolicy("c", 1, time.Minute))
	req := sluice.Request{Op: sluice.Acquire, Policy: "c", Subject: h.subject, EvaluationID: "retry-1"}
	first := h.limiter.Check(context.Background(), req)
	again := h.limiter.Check(context.Background(), req)
	expect(t, "first", first, sluice.Allowed)
	if again.Kind != sluice.Allowed || !again.Replayed || again.Lease.ID != first.Lease.ID {
		t.Fatalf("retry = %+v, want the replayed first decision naming lease %q", again, first.Lease.ID)
	}
	h.release("release the replayed lease", again.Lease, 1)
}

// testLeaseKeyRotation: after a key rotation the leases held under the
// caller's older pseudonym are carried to the new one, so a rotation does
// not double the slots; a lease carried over is released under the new
// subject.
func testLeaseKeyRotation(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, leasePolicy("c", 2, time.Minute))
	ctx := context.Background()
	old, neu := uniqueSubject(t, "old"), uniqueSubject(t, "new")
	var held []sluice.Lease
	for range 2 {
		o := h.limiter.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "c", Subject: old})
		expect(t, "acquire under the old subject", o, sluice.Allowed)
		held = append(held, o.Lease)
	}
	h.clock.Advance(time.Second)
	o := h.limiter.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "c", Subject: neu, Previous: []string{old}})
	if o.Kind != sluice.Denied || o.RetryAfter != 59*time.Second {
		t.Fatalf("acquire under the new subject, previous [old] = %+v (err %v), want denied for 59s: both leases carried over", o, o.Err)
	}
	moved := held[0]
	moved.Subject = neu
	if o := releaseLease(ctx, h.limiter, moved); o.Kind != sluice.Allowed || o.Remaining != 1 {
		t.Fatalf("Release of a carried lease under the new subject = %+v (err %v), want allowed, 1 remaining", o, o.Err)
	}
	expect(t, "acquire under the new subject after the release", h.limiter.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "c", Subject: neu, Previous: []string{old}}), sluice.Allowed)
}

// renew is a Check of a Renew of lease (the Limiter's Renew shorthand is gone).
func renew(l *sluice.Limiter, lease sluice.Lease) sluice.Outcome {
	return l.Check(context.Background(), sluice.Request{Op: sluice.Renew, Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID})
}
