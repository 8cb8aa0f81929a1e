package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// BreakerOptions configure a Store's circuit breaker. The zero value
// means the defaults.
type BreakerOptions struct {
	// Failures is how many round trips to Redis in a row must fail
	// (nothing sent, or no reply within Options.Timeout) before the
	// breaker opens: from then on decisions fail at once with
	// sluice.CircuitOpen, without waiting for a Redis that is down or
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
	// ProbeEvery is how often, while the breaker is open, the store PINGs
	// Redis itself (each PING bounded by Options.Timeout, one at a time):
	// the first answer half-opens the breaker at once, so decisions are
	// taken again within about ProbeEvery of Redis being back instead of
	// up to OpenFor, and no caller waits on a probe. Negative disables
	// the probe. Default: 100ms.
	ProbeEvery time.Duration
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

	// probe asks Redis whether it answers, every probeEvery while open,
	// from one goroutine at a time that stop ends; nil: no probe.
	probe      func(context.Context) error
	probeEvery time.Duration
	probeCtx   context.Context
	stop       context.CancelFunc
	probes     sync.WaitGroup
	probing    bool // a probe goroutine runs; guarded by mu

	mu     sync.Mutex
	state  string    // "closed", "open", "half_open"
	failed int       // consecutive failed round trips while closed
	since  time.Time // when it opened, or let the last decision through while half open
}

func newBreaker(o BreakerOptions, probe func(context.Context) error) *breaker {
	if o.Failures < 0 {
		return nil
	}
	if o.Failures == 0 {
		o.Failures = 5
	}
	if o.OpenFor <= 0 {
		o.OpenFor = time.Second
	}
	if o.ProbeEvery == 0 {
		o.ProbeEvery = 100 * time.Millisecond
	}
	b := &breaker{failures: o.Failures, openFor: o.OpenFor, onChange: o.OnChange, now: time.Now, state: "closed"}
	if o.ProbeEvery > 0 && probe != nil {
		b.probe, b.probeEvery = probe, o.ProbeEvery
		b.probeCtx, b.stop = context.WithCancel(context.Background())
	}
	return b
}

// close stops the probe, if one runs, and waits for it.
func (b *breaker) close() {
	if b == nil || b.stop == nil {
		return
	}
	b.mu.Lock()
	b.stop()
	b.mu.Unlock()
	b.probes.Wait()
}

// opened starts the probe goroutine unless one runs or the breaker is
// closed for good. Called with mu held, on entering the open state.
func (b *breaker) opened() {
	if b.probe == nil || b.probing || b.probeCtx.Err() != nil {
		return
	}
	b.probing = true
	b.probes.Add(1)
	go b.probeLoop()
}

// probeLoop PINGs Redis every probeEvery while the breaker is open; the
// first answer half-opens it, so the next decision goes through.
func (b *breaker) probeLoop() {
	defer b.probes.Done()
	t := time.NewTicker(b.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-b.probeCtx.Done():
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
			return
		case <-t.C:
		}
		b.mu.Lock()
		if b.state != "open" {
			b.probing = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		if !answers(b.probe(b.probeCtx)) {
			continue
		}
		b.mu.Lock()
		changed := ""
		if b.state == "open" {
			// since in the past: allow lets the next decision through.
			b.state, b.since, changed = "half_open", b.now().Add(-b.openFor), "half_open"
		}
		b.probing = false
		b.mu.Unlock()
		b.notify(changed)
		return
	}
}

// answers reports whether err, a probe's, shows Redis answering: no
// error, or an error reply of its own (a user not allowed PING, …).
func answers(err error) bool {
	var rerr redis.Error
	return err == nil || errors.As(err, &rerr) && !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrClosed)
}

// errOpen is the error of a decision the breaker did not let through.
var errOpen = fmt.Errorf("redisstore: Redis is failing, not asked: %w", sluice.CircuitOpen)

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

// isOpen reports whether the breaker sheds every decision now.
func (b *breaker) isOpen() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == "open"
}

// roundTrip records how a round trip to Redis ended: err is the error of
// (one of) its decisions, nil when Redis answered. Only failures for want
// of Redis count; a denial or a corrupt state is Redis answering.
func (b *breaker) roundTrip(err error) {
	if b == nil {
		return
	}
	failed := errors.Is(err, sluice.FailedBeforeSend) || errors.Is(err, sluice.ErrIndeterminate)
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
		b.opened()
	case b.state == "closed":
		if b.failed++; b.failed >= b.failures {
			b.state, b.since, changed = "open", b.now(), "open"
			b.opened()
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
