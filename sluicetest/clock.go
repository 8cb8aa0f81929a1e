// Package sluicetest holds the behavioural suite every sluice.Store must
// pass, and a fake clock to drive it.
package sluicetest

import (
	"sync"
	"time"
)

// start is the instant a NewClock reads: 2026-01-01T00:00:00Z, a whole
// number of days since the Unix epoch, so the windows sliding_window
// aligns to the epoch start there for every window that divides a day.
var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a fake sluice.Clock that moves only when told. Safe for
// concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock reading 2026-01-01T00:00:00Z, a whole number of
// days since the Unix epoch (so every window that divides a day starts
// there); Set moves it elsewhere.
func NewClock() *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d, which may be negative.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}
