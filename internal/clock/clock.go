// Package clock holds the real clocks of this module: the one place that
// reads the system time. Everything else takes a sluice.Clock, and tests
// hand in a fake one.
package clock

import "time"

// System is the real clock: the system time as time.Now reads it.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }

// Monotonic reads the system clock once and from then on advances by the
// monotonic clock: it never steps backwards or forwards when the system
// clock is adjusted (NTP, a manual change), and it is cheaper to read than
// time.Now. It drifts from the system clock by however much that clock is
// slewed while it runs, which does not matter to a store that keeps its
// state in one process (memstore's default). Safe for concurrent use.
type Monotonic struct {
	start      time.Time
	startMicro int64 // start.UnixMicro(), read once
}

// NewMonotonic returns a Monotonic clock that reads the system clock now.
func NewMonotonic() *Monotonic {
	now := time.Now()
	return &Monotonic{start: now, startMicro: now.UnixMicro()}
}

// Now returns the start time advanced by the monotonic time elapsed since.
func (c *Monotonic) Now() time.Time { return c.start.Add(time.Since(c.start)) }

// UnixMicro returns Now in microseconds since the Unix epoch, without
// building a time.Time.
func (c *Monotonic) UnixMicro() int64 {
	return c.startMicro + int64(time.Since(c.start)/time.Microsecond)
}

// AfterFunc runs f in its own goroutine once d has passed.
func (System) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// AfterFunc runs f in its own goroutine once d has passed.
func (c *Monotonic) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// afterFuncer is what a clock may offer beside Now: f run once d has
// passed on that clock (a test's fake clock, advanced by hand).
type afterFuncer interface {
	AfterFunc(d time.Duration, f func())
}

// Sleep waits until d has passed on c, or until done is closed (a
// context's Done), and reports whether d passed. The real clocks of this
// package wait on a timer that is stopped when done closes first; any
// other clock that offers AfterFunc (a fake one) is waited on through
// it, so a test advances the time by hand; one without it is waited on a
// real timer.
func Sleep(c interface{ Now() time.Time }, d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		return true
	}
	af, fake := c.(afterFuncer)
	switch c.(type) {
	case System, *System, *Monotonic:
		fake = false
	}
	if !fake {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-done:
			return false
		}
	}
	passed := make(chan struct{})
	af.AfterFunc(d, func() { close(passed) })
	select {
	case <-passed:
		return true
	case <-done:
		return false
	}
}
