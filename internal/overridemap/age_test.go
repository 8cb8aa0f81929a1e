package overridemap

import (
	"testing"
	"time"
)

// eagerClock runs every callback at once, in the caller's goroutine, as
// a test's fake clock may run one already due.
type eagerClock struct{ now time.Time }

func (c *eagerClock) Now() time.Time                      { return c.now }
func (c *eagerClock) AfterFunc(_ time.Duration, f func()) { f() }

// TestRecordRunsNoCallbackUnderItsLock: a clock that runs a callback at
// once deadlocked Record, which set its timers holding the lock their
// callbacks take. The callbacks now run once it is released, and do what
// they say: the ages they set stand.
func TestRecordRunsNoCallbackUnderItsLock(t *testing.T) {
	c := &eagerClock{now: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)}
	var f Freshness
	f.Init(c, MaxAge)
	done := make(chan struct{})
	go func() {
		f.Record(true, c.now, c.now)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a bound on a deadlock, not a speed
		t.Fatal("Record with a clock that runs its callbacks at once has not returned: it holds the lock they take")
	}
	if got := f.State(); got != Stale {
		t.Errorf("State() after both callbacks ran = %d, want Stale (%d)", got, Stale)
	}
}
