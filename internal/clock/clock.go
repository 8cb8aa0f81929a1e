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
