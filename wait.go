package sluice

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/clock"
)

// wait.go: a Book sent and waited for (Wait), or returned with a way to
// give it back (Reserve). The booking itself is the store's, in one
// atomic decision (Op Book); nothing here polls.

// bookBound puts req's bound in ev: its policy's MaxWait (the
// operator's), or a Book's own MaxWait when that is less; every other
// operation takes none. A request may ask to wait less than its policy
// allows, never more: one that asks for more is held to the policy's
// (whatever the edge: the check API's max_wait_ms, a queue's max delay,
// a library caller's Request), so no caller books more than a window's
// refill of a shared subject ahead.
func bookBound(ev *Evaluation, req *Request) error {
	switch {
	case req.MaxWait < 0:
		return fmt.Errorf("sluice: %w: max wait = %v: must not be negative", ErrInvalidRequest, req.MaxWait)
	case req.Op != Book && req.MaxWait != 0:
		return fmt.Errorf("sluice: %w: max wait = %v: only a book waits, not %v", ErrInvalidRequest, req.MaxWait, req.Op)
	case req.Op != Book:
		return nil
	}
	ev.MaxWait = req.MaxWait
	if len(ev.Policies) > 0 {
		ev.MaxWait = mostWait(req.MaxWait, ev.Policies[0])
	}
	return nil
}

// mostWait is a Book's bound on p: p's MaxWait, or asked when that is
// less (0: not asked). A p with no MaxWait (an algorithm with no future
// slot, which the store refuses to book) leaves asked as it is.
func mostWait(asked time.Duration, p *Policy) time.Duration {
	if p.MaxWait > 0 && (asked == 0 || asked > p.MaxWait) {
		return p.MaxWait
	}
	return asked
}

// Reserve books req's cost (Op Book: req.Op must be Spend or Book) and
// returns at once, as x/time/rate's Reserve does: the Outcome, Allowed
// with Status.Delay the wait until the booked slot (0: admitted now), or
// Denied when the slot lies past MaxWait (nothing booked), or any
// failure Check answers; and cancel, which gives the booking back (a
// Refund of its cost) while its slot is still ahead, and does nothing
// after it, for an outcome that booked nothing, or when called again.
// The booking is given back exactly while it is the latest of its policy
// and subject. When others were booked after it, in any process, their
// slots stand and the schedule moves back under them: up to Cost units
// more may then be admitted around them than the rate allows, an
// approximation, as x/time/rate's Reservation.Cancel is one.
func (l *Limiter) Reserve(ctx context.Context, req Request) (Outcome, func()) {
	if req.Op != Spend && req.Op != Book {
		return Outcome{Kind: Incompatible, Err: fmt.Errorf("sluice: %w: op %v: a reservation books a spend: leave Op unset or Book", ErrInvalidRequest, req.Op)}, func() {}
	}
	req.Op = Book
	o := l.Check(ctx, req)
	if o.Kind != Allowed || o.Delay <= 0 {
		return o, func() {}
	}
	slot := l.clock.Now().Add(o.Delay)
	var once sync.Once
	return o, func() {
		once.Do(func() {
			if l.clock.Now().Before(slot) {
				l.giveBack(context.WithoutCancel(ctx), req)
			}
		})
	}
}

// giveBack refunds what req, a Book, booked.
func (l *Limiter) giveBack(ctx context.Context, req Request) Outcome {
	cost := req.Cost
	if cost == 0 {
		cost = 1
	}
	return l.Check(ctx, Request{Op: Refund, Policy: req.Policy, Policies: req.Policies, Subject: req.Subject, Previous: req.Previous, Cost: cost})
}

// Wait books req's cost as Reserve does and sleeps until the booked slot
// on the Limiter's clock (Options.Clock; one that offers AfterFunc(d
// time.Duration, f func()), as a test's fake clock may, is waited on
// through it), then returns the Outcome: Allowed, its Delay the time
// waited. The bound is the policy's MaxWait (or the request's, when
// less), and ctx's deadline when it comes sooner: a slot past either is
// Denied at once, booking nothing, its Err saying which bound it lay past
// (wrapping context.DeadlineExceeded for the deadline) and its RetryAfter
// when the cost would fit. A slot the store booked within the deadline is
// waited for even when the store's round trip puts it a little past the
// deadline: the store decided it, from its own instant, within the bound.
// A ctx canceled (or past its deadline by more than the round trip)
// before the slot gives the booking back, as Reserve's cancel does, and
// returns Unavailable, cause DeadlinePassed, its Err saying whether it
// was given back (a refund the store could not take leaves the units
// spent). Any other failure is Check's.
func (l *Limiter) Wait(ctx context.Context, req Request) Outcome {
	most, byDeadline := req.MaxWait, false
	if p := l.policy(req.Policy); p != nil {
		most = mostWait(most, p)
	}
	if d, ok := ctx.Deadline(); ok {
		if left := d.Sub(l.clock.Now()).Truncate(time.Microsecond); left < most {
			req.MaxWait, byDeadline = max(left, time.Microsecond), true // a deadline passed is Check's to answer
		}
	}
	sent := l.clock.Now()
	o, _ := l.Reserve(ctx, req)
	if o.Kind == Denied {
		o.Err = waitDenied(o.RetryAfter, most, byDeadline)
		return o
	}
	if o.Kind != Allowed {
		return o
	}
	replied := l.clock.Now()
	done, stop := waitDone(ctx, replied.Add(o.Delay), replied.Sub(sent))
	slept := clock.Sleep(l.clock, o.Delay, done)
	stop()
	if slept {
		return o
	}
	err := ctx.Err()
	if r := l.giveBack(context.WithoutCancel(ctx), Request{Policy: req.Policy, Policies: req.Policies, Subject: req.Subject, Previous: req.Previous, Cost: req.Cost}); r.Kind != Allowed {
		err = fmt.Errorf("sluice: wait: %w before the slot booked %v ahead; giving it back failed, its units stay spent: %w", err, o.Delay, r.Err)
	} else {
		err = fmt.Errorf("sluice: wait: %w before the slot booked %v ahead; the booking was given back", err, o.Delay)
	}
	return Outcome{Kind: Unavailable, Cause: DeadlinePassed, Err: err}
}

// waitDenied is the Err of a Wait denied at once: the slot lay past the
// most it may wait, the context's deadline (byDeadline) or the policy's
// MaxWait; retry is when the cost would fit.
func waitDenied(retry, most time.Duration, byDeadline bool) error {
	if byDeadline {
		return fmt.Errorf("sluice: wait: the slot lies past the context's deadline (the cost would fit in %v): %w", retry, context.DeadlineExceeded)
	}
	return fmt.Errorf("sluice: wait: the slot lies past the most to wait, %v (the cost would fit in %v)", most, retry)
}

// waitDone is what ends a Wait's sleep before slot: ctx's cancellation, or
// its deadline when that passes more than rtt (the store's round trip)
// before slot. The store booked the slot within the deadline from its own
// instant, which came up to rtt before the reply the sleep is counted
// from: a slot that lies past the deadline by no more than that is the
// booking kept, not a deadline missed.
// stop releases what waitDone set up once the sleep is over.
func waitDone(ctx context.Context, slot time.Time, rtt time.Duration) (done <-chan struct{}, stop func()) {
	d, ok := ctx.Deadline()
	if !ok || slot.After(d.Add(rtt)) || !slot.After(d) {
		return ctx.Done(), func() {}
	}
	canceled := make(chan struct{})
	release := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			close(canceled)
		}
	})
	return canceled, func() { release() }
}
