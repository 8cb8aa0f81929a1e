package edge

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// lazyDeadline is context.WithDeadline(parent, at) whose timer is made
// only when someone waits on Done: a store that answers in memory asks
// Err and Deadline and never waits, and a timer started and stopped per
// decision was a fifth of the check API handler's CPU. Deadline, Err and
// Done say what WithDeadline's would, before and after stop (its
// cancel); Value is the parent's.
type lazyDeadline struct {
	context.Context // the parent
	at              time.Time
	once            sync.Once
	made            context.Context // WithDeadline's, once Done was asked: set before isMade
	cancel          context.CancelFunc
	isMade          atomic.Bool // made and cancel are set (a pointer to made was an allocation per decision)
	stopped         atomic.Bool
}

// withLazyDeadline returns parent bounded by at, and its cancel.
func withLazyDeadline(parent context.Context, at time.Time) (*lazyDeadline, func()) {
	c := &lazyDeadline{Context: parent, at: at}
	return c, c.stop
}

func (c *lazyDeadline) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.at) {
		return d, true
	}
	return c.at, true
}

func (c *lazyDeadline) Done() <-chan struct{} {
	c.once.Do(c.make)
	return c.made.Done()
}

// make makes WithDeadline's context, cancelled already when c was
// stopped first.
func (c *lazyDeadline) make() {
	c.made, c.cancel = context.WithDeadline(c.Context, c.at)
	c.isMade.Store(true)
	if c.stopped.Load() { // stop may have missed it
		c.cancel()
	}
}

func (c *lazyDeadline) Err() error {
	if c.isMade.Load() {
		return c.made.Err()
	}
	if err := c.Context.Err(); err != nil {
		return err
	}
	if c.stopped.Load() {
		return context.Canceled
	}
	if !time.Now().Before(c.at) {
		return context.DeadlineExceeded
	}
	return nil
}

// stop is WithDeadline's cancel: it releases the timer, if one was made.
func (c *lazyDeadline) stop() {
	c.stopped.Store(true)
	if c.isMade.Load() {
		c.cancel()
	}
}
