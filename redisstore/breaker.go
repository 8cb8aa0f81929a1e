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
	// Failures is how many decisions in a row must fail for want of Redis
	// (nothing sent, or no reply) before the breaker opens: from then on
	// decisions fail at once with sluice.ErrCircuitOpen, without waiting
	// for a Redis that is down or hung. Negative disables the breaker.
	// Default: 5.
	Failures int
	// OpenFor is how long the breaker stays open before it lets one
	// decision through to try Redis again (half open): its success closes
	// the breaker, its failure opens it for another OpenFor. Default: 1s.
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

	mu       sync.Mutex
	state    string // "closed", "open", "half_open"
	failed   int    // consecutive failures while closed
	openedAt time.Time
	probing  bool // the half-open probe is on its way
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
// while open, only the one probe once OpenFor has passed.
func (b *breaker) allow() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	var changed string
	switch {
	case b.state == "closed":
	case b.state == "open" && b.now().Sub(b.openedAt) >= b.openFor:
		b.state, b.probing, changed = "half_open", true, "half_open"
	case b.state == "half_open" && !b.probing:
		b.probing = true
	default:
		b.mu.Unlock()
		return errOpen
	}
	b.mu.Unlock()
	b.notify(changed)
	return nil
}

// done records how a decision that was let through ended. Only failures
// for want of Redis count; a denial or a corrupt state is Redis answering.
func (b *breaker) done(err error) {
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
		b.state, b.failed, b.probing = "closed", 0, false
	case b.state == "half_open":
		b.state, b.openedAt, b.probing, changed = "open", b.now(), false, "open"
	case b.state == "closed":
		if b.failed++; b.failed >= b.failures {
			b.state, b.openedAt, changed = "open", b.now(), "open"
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
