package redisstore

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// BreakerOptions configure a Store's circuit breaker. The zero value
// means the defaults.
type BreakerOptions struct {
	// Failures is how many round trips to Redis in a row must fail
	// (nothing sent, or no reply within Options.Timeout) before the
	// breaker opens: from then on decisions fail at once with
	// sluice.ErrCircuitOpen, without waiting for a Redis that is down or
	// hung. A caller that gives up on its own deadline does not count:
	// that says nothing about Redis. Negative disables the breaker.
	// Default: 5.
	Failures int
	// OpenFor is how long the breaker stays open before it lets one
	// decision through to try Redis again (half open), and how often it
	// lets one through while half open: a round trip that succeeds closes
	// the breaker, one that fails opens it for another OpenFor.
	// Default: 1s.
	OpenFor time.Duration
	// OnChange, when set, is called with each new state ("closed",
	// "open", "half_open"), outside the breaker's lock; for metrics and
	// logs. Default: nil.
	OnChange func(state string)
}

// breaker counts a Store's consecutive failures for want of Redis and
// sheds decisions while Redis is known to be failing. Safe for concurrent
// use.
type breaker struct {
	failures int
	openFor  time.Duration
	onChange func(string)
	now      func() time.Time

	mu     sync.Mutex
	state  string    // "closed", "open", "half_open"
	failed int       // consecutive failed round trips while closed
	since  time.Time // when it opened, or let the last decision through while half open
}

func newBreaker(o BreakerOptions) *breaker {
	if o.Failures < 0 {
		return nil
	}
	if o.Failures == 0 {
		o.Failures = 5
	}
	if o.OpenFor <= 0 {
		o.OpenFor = time.Second
	}
	return &breaker{failures: o.Failures, openFor: o.OpenFor, onChange: o.OnChange, now: time.Now, state: "closed"}
}

// errOpen is the error of a decision the breaker did not let through.
var errOpen = fmt.Errorf("redisstore: Redis is failing, not asked: %w", sluice.ErrCircuitOpen)

// allow reports whether a decision may go to Redis: always while closed;
// otherwise one every OpenFor, from OpenFor after it opened.
func (b *breaker) allow() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	var changed string
	switch {
	case b.state == "closed":
	case b.now().Sub(b.since) >= b.openFor:
		if b.state == "open" {
			changed = "half_open"
		}
		b.state, b.since = "half_open", b.now()
	default:
		b.mu.Unlock()
		return errOpen
	}
	b.mu.Unlock()
	b.notify(changed)
	return nil
}

// roundTrip records how a round trip to Redis ended: err is the error of
// (one of) its decisions, nil when Redis answered. Only failures for want
// of Redis count; a denial or a corrupt state is Redis answering.
func (b *breaker) roundTrip(err error) {
	if b == nil {
		return
	}
	failed := errors.Is(err, sluice.ErrBeforeSend) || errors.Is(err, sluice.ErrIndeterminate)
	b.mu.Lock()
	var changed string
	switch {
	case !failed:
		if b.state != "closed" {
			changed = "closed"
		}
		b.state, b.failed = "closed", 0
	case b.state == "half_open":
		b.state, b.since, changed = "open", b.now(), "open"
	case b.state == "closed":
		if b.failed++; b.failed >= b.failures {
			b.state, b.since, changed = "open", b.now(), "open"
		}
	}
	b.mu.Unlock()
	b.notify(changed)
}

func (b *breaker) notify(state string) {
	if state != "" && b.onChange != nil {
		b.onChange(state)
	}
}
