package overridemap

// How old the tenant overrides a Limiter read from its store are, on the
// Limiter's clock, and the read under way (Freshness), over a clock that
// is anything with Now.

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is what Freshness reads: the Limiter's clock.
type Clock interface{ Now() time.Time }

// afterFuncer is what a Clock may offer beside Now: f run once d has
// passed on that clock. internal/clock's clocks offer it, so a Limiter
// on one learns that its overrides aged from a timer, not by reading the
// clock on every Check; a Clock without it (a test's fake one) is read
// on every Check instead.
type afterFuncer interface {
	AfterFunc(d time.Duration, f func())
}

// The ages of a Limiter's overrides read from its store.
const (
	Fresh int32 = iota // read less than half the maximum age ago
	Old                // read again in the background
	Stale              // read again before deciding
)

// Freshness tracks how old the overrides a Limiter read from its store
// are, on the Limiter's clock, and the read under way. Safe for
// concurrent use.
type Freshness struct {
	clock   Clock
	maxAge  time.Duration                 // a fresh read is stale after it
	timers  afterFuncer                   // clock's, nil when it has none: state reads the clock
	mu      sync.Mutex                    // held to change the ages, gen and reading
	gen     uint64                        // the timers of older reads are spent
	flag    atomic.Int32                  // with timers: the age, set by them
	oldAt   atomic.Int64                  // Unix ns from when the overrides are Old
	staleAt atomic.Int64                  // Unix ns from when they are Stale
	reading atomic.Pointer[chan struct{}] // closed when the read under way ends; nil when none
	failing atomic.Bool                   // the last read to end failed
}

// Init makes f stale until a first read, on clock c, a fresh read
// staying fresh for half maxAge and not stale before maxAge.
func (f *Freshness) Init(c Clock, maxAge time.Duration) {
	f.clock, f.maxAge = c, maxAge
	f.timers, _ = c.(afterFuncer)
	f.flag.Store(Stale)
	f.oldAt.Store(math.MinInt64)
	f.staleAt.Store(math.MinInt64)
}

// State returns the age of the overrides now.
func (f *Freshness) State() int32 {
	if f.timers != nil {
		return f.flag.Load()
	}
	return f.at(f.clock.Now().UnixNano())
}

// at returns the age of the overrides at now, Unix ns.
func (f *Freshness) at(now int64) int32 {
	switch {
	case now >= f.staleAt.Load():
		return Stale
	case now >= f.oldAt.Load():
		return Old
	}
	return Fresh
}

// Begin returns the channel of the read under way, or starts one: then
// started is true and the caller reads, then calls End.
func (f *Freshness) Begin() (ch chan struct{}, started bool) {
	if p := f.reading.Load(); p != nil {
		return *p, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.reading.Load(); p != nil {
		return *p, false
	}
	ch = make(chan struct{})
	f.reading.Store(&ch)
	return ch, true
}

// Failing reports whether the last read to end failed.
func (f *Freshness) Failing() bool { return f.failing.Load() }

// Record records a read begun at began and over at now. A fresh read
// (the overrides as the store held them at began) is old half the
// maximum age after began and stale at the maximum age. A failed read
// changes neither: the overrides are as old as the last read that
// succeeded, so once the store answers again no decision is taken on
// overrides older than the maximum age. The clock's timers are set once
// f.mu is released: a clock may run a callback at once (a test's fake one
// that is already past it), and each callback takes f.mu.
func (f *Freshness) Record(fresh bool, began, now time.Time) {
	f.mu.Lock()
	f.failing.Store(!fresh)
	if fresh {
		f.oldAt.Store(max(f.oldAt.Load(), began.Add(f.maxAge/2).UnixNano()))
		f.staleAt.Store(max(f.staleAt.Load(), began.Add(f.maxAge).UnixNano()))
	}
	if f.timers == nil {
		f.mu.Unlock()
		return
	}
	f.gen++
	gen := f.gen
	at := now.UnixNano()
	f.flag.Store(f.at(at))
	oldAt, staleAt := f.oldAt.Load(), f.staleAt.Load()
	f.mu.Unlock()
	set := func(age int32) func() {
		return func() {
			f.mu.Lock()
			if f.gen == gen && f.flag.Load() < age {
				f.flag.Store(age)
			}
			f.mu.Unlock()
		}
	}
	if oldAt > at {
		f.timers.AfterFunc(time.Duration(oldAt-at), set(Old))
	}
	if staleAt > at {
		f.timers.AfterFunc(time.Duration(staleAt-at), set(Stale))
	}
}

// End ends the read of ch, begun at began and over at now, as Record
// says.
func (f *Freshness) End(ch chan struct{}, fresh bool, began, now time.Time) {
	f.Record(fresh, began, now)
	f.reading.Store(nil)
	close(ch)
}
