package sluice_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// sleepClock is sluicetest.Clock with AfterFunc: the timers it is handed
// run when Advance passes them (each in a goroutine of its own, as
// time.AfterFunc runs them), and armed receives each one's wait as it is
// armed, so a test knows a Wait is asleep before it moves time (the
// Limiter's override timers are armed on it too: asleep waits for the
// wait it names).
type sleepClock struct {
	*sluicetest.Clock
	mu     sync.Mutex
	timers []clockTimer
	armed  chan time.Duration
}

func newSleepClock() *sleepClock {
	return &sleepClock{Clock: sluicetest.NewClock(), armed: make(chan time.Duration, 64)}
}

func (c *sleepClock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	c.timers = append(c.timers, clockTimer{c.Now().Add(d), f})
	c.mu.Unlock()
	select {
	case c.armed <- d:
	default:
	}
}

// asleep returns once a timer of d is armed.
func (c *sleepClock) asleep(t *testing.T, d time.Duration) {
	t.Helper()
	for got := range c.armed {
		if got == d {
			return
		}
	}
}

// Advance moves the clock by d and runs the timers it passes.
func (c *sleepClock) Advance(d time.Duration) {
	c.Clock.Advance(d)
	now := c.Now()
	c.mu.Lock()
	var due []func()
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(now) {
			kept = append(kept, t)
		} else {
			due = append(due, t.f)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	for _, f := range due {
		go f()
	}
}

func newWaitLimiter(t *testing.T, clock sluice.Clock, policies ...sluice.Policy) *sluice.Limiter {
	t.Helper()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	l, err := sluice.New(ms, policies, sluice.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// gcra200 is 200 per second, burst 2: a slot every 5ms.
var gcra200 = sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 200, Window: time.Second, Burst: 2}

// TestWaitSleepsUntilItsSlot: with the burst spent, Wait books the next
// slot, sleeps on the Limiter's clock until it, and is Allowed with the
// time it waited; the slot after it is booked for the next waiter.
func TestWaitSleepsUntilItsSlot(t *testing.T) {
	clock := newSleepClock()
	l := newWaitLimiter(t, clock, gcra200)
	ctx := context.Background()
	for i := range 2 {
		if o := l.Wait(ctx, sluice.Request{Policy: "api", Subject: "s"}); o.Kind != sluice.Allowed || o.Delay != 0 {
			t.Fatalf("Wait %d within the burst = %+v, want Allowed at once", i, o)
		}
	}
	got := make(chan sluice.Outcome)
	go func() { got <- l.Wait(ctx, sluice.Request{Policy: "api", Subject: "s"}) }()
	clock.asleep(t, 5*time.Millisecond)
	clock.Advance(5 * time.Millisecond)
	if o := <-got; o.Kind != sluice.Allowed || o.Delay != 5*time.Millisecond {
		t.Fatalf("Wait = %+v, want Allowed after 5ms", o)
	}
	o, _ := l.Reserve(ctx, sluice.Request{Policy: "api", Subject: "s"})
	if o.Kind != sluice.Allowed || o.Delay != 5*time.Millisecond {
		t.Fatalf("Reserve after it = %+v, want Allowed with the next slot 5ms ahead", o)
	}
}

// TestWaitBounds: a slot past MaxWait (the policy's, or the request's
// when less) or past the context's deadline is Denied at once and books nothing.
func TestWaitBounds(t *testing.T) {
	clock := newSleepClock()
	p := gcra200
	p.MaxWait = 5 * time.Millisecond
	l := newWaitLimiter(t, clock, p)
	ctx := context.Background()
	for range 2 {
		l.Wait(ctx, sluice.Request{Policy: "api", Subject: "s"})
	}
	if o := l.Wait(ctx, sluice.Request{Policy: "api", Subject: "s", MaxWait: 4 * time.Millisecond}); o.Kind != sluice.Denied || o.RetryAfter != 5*time.Millisecond || o.Err == nil || !strings.Contains(o.Err.Error(), "past the most to wait, 4ms") {
		t.Fatalf("Wait past its own max wait = %+v, want Denied, retry after 5ms, its Err naming the 4ms bound", o)
	}
	if o := l.Wait(ctx, sluice.Request{Policy: "api", Subject: "s", Cost: 2, MaxWait: time.Second}); o.Kind != sluice.Denied || o.RetryAfter != 10*time.Millisecond {
		t.Fatalf("Wait(cost=2) past the policy's max wait, asking for 1s = %+v, want Denied, retry after 10ms", o)
	}
	// A context's deadline is on the real clock: a Limiter whose clock
	// reads the real time now, a slot an hour ahead, a deadline in 30m.
	real := newSleepClock()
	real.Set(time.Now())
	hourly := newWaitLimiter(t, real, sluice.Policy{ID: "hourly", Algorithm: sluice.GCRA, Limit: 1, Window: time.Hour, MaxWait: 2 * time.Hour})
	hourly.Wait(ctx, sluice.Request{Policy: "hourly", Subject: "s"})
	dl, cancel := context.WithDeadline(ctx, real.Now().Add(30*time.Minute))
	defer cancel()
	if o := hourly.Wait(dl, sluice.Request{Policy: "hourly", Subject: "s", MaxWait: 2 * time.Hour}); o.Kind != sluice.Denied || !errors.Is(o.Err, context.DeadlineExceeded) {
		t.Fatalf("Wait past the context's deadline = %+v, want Denied, its Err context.DeadlineExceeded (as x/time/rate's Wait)", o)
	}
	if o, _ := hourly.Reserve(ctx, sluice.Request{Policy: "hourly", Subject: "s", MaxWait: 2 * time.Hour}); o.Kind != sluice.Allowed || o.Delay != time.Hour {
		t.Fatalf("Reserve after it = %+v, want the slot an hour ahead: the denial booked nothing", o)
	}
	if o, _ := l.Reserve(ctx, sluice.Request{Policy: "api", Subject: "s"}); o.Kind != sluice.Allowed || o.Delay != 5*time.Millisecond {
		t.Fatalf("Reserve within the policy's max wait = %+v: want the first slot, 5ms ahead: the denials booked nothing", o)
	}
}

// TestWaitContextEnds: a context cancelled while Wait sleeps gives the
// booking back and answers Unavailable, saying so; the slot is free for
// the next waiter.
func TestWaitContextEnds(t *testing.T) {
	clock := newSleepClock()
	l := newWaitLimiter(t, clock, gcra200)
	ctx, cancel := context.WithCancel(context.Background())
	for range 2 {
		l.Wait(ctx, sluice.Request{Policy: "api", Subject: "s"})
	}
	got := make(chan sluice.Outcome)
	go func() { got <- l.Wait(ctx, sluice.Request{Policy: "api", Subject: "s"}) }()
	clock.asleep(t, 5*time.Millisecond)
	cancel()
	o := <-got
	if o.Kind != sluice.Unavailable || o.Cause != sluice.DeadlinePassed || !errors.Is(o.Err, context.Canceled) || !strings.Contains(o.Err.Error(), "given back") {
		t.Fatalf("Wait cancelled = %+v, want Unavailable, deadline passed, the booking given back", o)
	}
	if o, _ := l.Reserve(context.Background(), sluice.Request{Policy: "api", Subject: "s"}); o.Delay != 5*time.Millisecond {
		t.Fatalf("Reserve after the cancelled wait = %+v, want the slot it gave back, 5ms ahead", o)
	}
}

// TestReserveCancel: cancel gives a booking back while its slot is
// ahead, once; after the slot it does nothing.
func TestReserveCancel(t *testing.T) {
	clock := newSleepClock()
	l := newWaitLimiter(t, clock, gcra200)
	ctx := context.Background()
	req := sluice.Request{Policy: "api", Subject: "s"}
	for range 2 {
		l.Wait(ctx, req)
	}
	o, cancel := l.Reserve(ctx, req)
	if o.Delay != 5*time.Millisecond {
		t.Fatalf("Reserve = %+v, want 5ms ahead", o)
	}
	cancel()
	cancel()
	o, cancel = l.Reserve(ctx, req)
	if o.Delay != 5*time.Millisecond {
		t.Fatalf("Reserve after cancel = %+v, want the same slot, 5ms ahead (given back once)", o)
	}
	clock.Advance(5 * time.Millisecond)
	cancel() // the slot has come: nothing to give back
	if o, _ := l.Reserve(ctx, req); o.Delay != 5*time.Millisecond {
		t.Fatalf("Reserve after a late cancel = %+v, want the next slot 5ms ahead", o)
	}
}

// TestBookRefused: the other algorithms have no slot to book, a bound
// on another operation is refused, and Reserve takes only a spend.
func TestBookRefused(t *testing.T) {
	l := newWaitLimiter(t, sluicetest.NewClock(), gcra200, sluice.Policy{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Second})
	ctx := context.Background()
	for _, c := range []struct {
		req  sluice.Request
		want string
	}{
		{sluice.Request{Op: sluice.Book, Policy: "fw", Subject: "s"}, "only gcra and token_bucket"},
		{sluice.Request{Policy: "api", Subject: "s", MaxWait: time.Second}, "only a book waits"},
		{sluice.Request{Op: sluice.Book, Policy: "api", Subject: "s", MaxWait: -1}, "must not be negative"},
		{sluice.Request{Op: sluice.Book, Policies: []string{"api", "fw"}, Subject: "s"}, "exactly one policy"},
	} {
		if o := l.Check(ctx, c.req); o.Kind != sluice.Incompatible || !strings.Contains(o.Err.Error(), c.want) {
			t.Errorf("Check(%+v) = %+v, want Incompatible saying %q", c.req, o, c.want)
		}
	}
	if o, _ := l.Reserve(ctx, sluice.Request{Op: sluice.Refund, Policy: "api", Subject: "s"}); o.Kind != sluice.Incompatible {
		t.Errorf("Reserve of a refund = %+v, want Incompatible", o)
	}
}

// TestPolicyMaxWait: a bucket's MaxWait defaults to its window, at most
// a minute; other algorithms take none.
func TestPolicyMaxWait(t *testing.T) {
	l := newWaitLimiter(t, sluicetest.NewClock(), gcra200, sluice.Policy{ID: "slow", Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Hour})
	for id, want := range map[string]time.Duration{"api": time.Second, "slow": time.Minute} {
		if p, _ := l.Policy(id); p.MaxWait != want {
			t.Errorf("policy %s: MaxWait = %v, want %v", id, p.MaxWait, want)
		}
	}
	err := sluice.Policy{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Second, MaxWait: time.Second}.Validate()
	if err == nil || !strings.Contains(err.Error(), "max_wait = 1s: applies only to token_bucket and gcra") {
		t.Errorf("Validate(fixed_window with max_wait) = %v, want the rule", err)
	}
	err = sluice.Policy{ID: "g", Algorithm: sluice.GCRA, Limit: 3, Window: time.Second, MaxWait: 25 * time.Hour}.Validate()
	if err == nil || !strings.Contains(err.Error(), "max_wait = 25h0m0s: must be between 0s and 24h0m0s") {
		t.Errorf("Validate(max_wait 25h) = %v, want the rule", err)
	}
}

// TestBookBoundedByPolicy: the policy's MaxWait (the operator's) bounds
// every booking: a request may ask for less, never more. 300 books of
// cost 10 each asking to wait a day on gcra 10/s, max wait 1s, book at
// most the burst now and one window's refill ahead, the rest Denied; a
// spend of another caller is then admitted again within that second, not
// a day later. Wait with the same bound, and no deadline, is Denied too.
func TestBookBoundedByPolicy(t *testing.T) {
	clock := newSleepClock()
	l := newWaitLimiter(t, clock, sluice.Policy{ID: "shared", Algorithm: sluice.GCRA, Limit: 10, Window: time.Second, MaxWait: time.Second})
	ctx := context.Background()
	greedy := sluice.Request{Op: sluice.Book, Policy: "shared", Subject: "s", Cost: 10, MaxWait: 24 * time.Hour}
	booked := 0
	for i := range 300 {
		o := l.Check(ctx, greedy)
		switch {
		case o.Kind == sluice.Allowed && o.Delay <= time.Second:
			booked++
		case o.Kind != sluice.Denied:
			t.Fatalf("Check(book %d, cost=10, max wait 24h) = %+v (err %v), want allowed within the policy's 1s or denied", i, o, o.Err)
		}
	}
	if booked != 2 {
		t.Fatalf("books of cost 10 asking for 24h on gcra 10/s, max wait 1s: %d booked, want 2 (the burst now, a window's refill ahead)", booked)
	}
	if o := l.Wait(ctx, greedy); o.Kind != sluice.Denied {
		t.Fatalf("Wait(cost=10, max wait 24h) = %+v, want denied: its slot lies past the policy's 1s", o)
	}
	if o, _ := l.Reserve(ctx, sluice.Request{Policy: "shared", Subject: "s", Cost: 10, MaxWait: time.Hour}); o.Kind != sluice.Denied {
		t.Fatalf("Reserve(cost=10, max wait 1h) = %+v, want denied", o)
	}
	o := l.Check(ctx, sluice.Request{Policy: "shared", Subject: "s"})
	if o.Kind != sluice.Denied || o.RetryAfter > 2*time.Second {
		t.Fatalf("Check(spend 1) after the books = %+v, want denied with Retry-After at most 2s (what was booked)", o)
	}
	clock.Advance(o.RetryAfter)
	if o := l.Check(ctx, sluice.Request{Policy: "shared", Subject: "s"}); o.Kind != sluice.Allowed {
		t.Fatalf("Check(spend 1) %v later = %+v, want allowed", o.RetryAfter, o)
	}
	if o := l.Check(ctx, sluice.Request{Op: sluice.Book, Policy: "shared", Subject: "s", MaxWait: 50 * time.Millisecond}); o.Kind != sluice.Denied || o.RetryAfter != 100*time.Millisecond {
		t.Fatalf("Check(book, max wait 50ms) = %+v, want denied: a request may ask for less than the policy's bound", o)
	}
}

// clockCtx is a context whose deadline is on a test's clock: Done closes
// when the test says the deadline has come (expire).
type clockCtx struct {
	context.Context
	deadline time.Time
	done     chan struct{}
}

func newClockCtx(deadline time.Time) *clockCtx {
	return &clockCtx{Context: context.Background(), deadline: deadline, done: make(chan struct{})}
}

func (c *clockCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *clockCtx) Done() <-chan struct{}       { return c.done }
func (c *clockCtx) expire()                     { close(c.done) }
func (c *clockCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// roundTrip is a store whose answer takes rtt on the Limiter's clock
// after its decision, as a Redis round trip does.
type roundTrip struct {
	sluice.Store
	clock *sleepClock
	rtt   time.Duration
}

func (s *roundTrip) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	err := s.Store.Evaluate(ctx, ev)
	s.clock.Advance(s.rtt)
	return err
}

// TestWaitDeadlineAtItsSlot: a deadline at the very slot the store
// booked within it, from the instant it decided, is no deadline missed:
// the reply came 50µs after that decision, and the sleep counted from the
// reply ends 50µs past the deadline. Wait waited for its slot and is
// Allowed, where it answered Unavailable and gave the booking back.
func TestWaitDeadlineAtItsSlot(t *testing.T) {
	clock := newSleepClock()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	const rtt = 50 * time.Microsecond
	store := &roundTrip{Store: ms, clock: clock}
	l, err := sluice.New(store, []sluice.Policy{gcra200}, sluice.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	req := sluice.Request{Policy: "api", Subject: "s"}
	for range 2 {
		l.Wait(context.Background(), req)
	}
	store.rtt = rtt
	ctx := newClockCtx(clock.Now().Add(5 * time.Millisecond)) // the next slot's instant
	got := make(chan sluice.Outcome)
	go func() { got <- l.Wait(ctx, req) }()
	clock.asleep(t, 5*time.Millisecond)
	clock.Advance(5*time.Millisecond - rtt) // the deadline
	ctx.expire()
	clock.Advance(rtt) // the slot, counted from the reply
	if o := <-got; o.Kind != sluice.Allowed || o.Delay != 5*time.Millisecond {
		t.Fatalf("Wait with its deadline at the slot the store booked = %+v (%v), want Allowed after 5ms", o, o.Err)
	}
}
