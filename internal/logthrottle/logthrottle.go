// Package logthrottle lets a few log records of a kind through per
// interval and counts the rest, so that an outage, which fails every
// request, writes a few lines a second with a count instead of one line
// per request.
package logthrottle

import (
	"sync"
	"time"
)

// Throttle is one kind of record's throttle. The zero value lets 10
// records through per second. Safe for concurrent use.
type Throttle struct {
	// Every is the interval. Default: 1s.
	Every time.Duration
	// Burst is how many records an interval lets through. Default: 10.
	Burst int

	mu         sync.Mutex
	start      time.Time // of the current interval
	written    int       // records let through in it
	suppressed int64     // records held back since the last one written
}

// Allow reports whether a record may be written at now, and if so how many
// were held back since the last one written.
func (t *Throttle) Allow(now time.Time) (ok bool, suppressed int64) {
	every, burst := t.Every, t.Burst
	if every <= 0 {
		every = time.Second
	}
	if burst <= 0 {
		burst = 10
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !now.Before(t.start.Add(every)) {
		t.start, t.written = now, 0
	}
	if t.written >= burst {
		t.suppressed++
		return false, 0
	}
	t.written++
	suppressed, t.suppressed = t.suppressed, 0
	return true, suppressed
}

// Latest throttles the records of a state that changes, such as a circuit
// breaker's: at most one record per Every, and a change held back is
// written once its interval is over, so the last record written always
// names the current state. Write receives the state and how many changes
// were held back and never written since the previous record.
//
// Write is required; it is called with Latest's lock held, in the order
// of the changes, and must not call Record. Safe for concurrent use. Stop
// ends the timer of a pending write.
type Latest struct {
	// Every is the interval. Default: 1s.
	Every time.Duration
	// Now reads the clock the interval is measured on. Default: time.Now.
	Now func() time.Time
	// Write writes one record. Required.
	Write func(state string, suppressed int64)

	mu       sync.Mutex
	throttle Throttle
	pending  string      // the latest state held back
	held     int64       // changes held back since the last record
	timer    *time.Timer // non-nil while a state is pending
	stopped  bool
}

// Record reports a change to state.
func (l *Latest) Record(state string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	l.throttle.Every, l.throttle.Burst = l.every(), 1
	if ok, _ := l.throttle.Allow(l.now()); ok {
		n := l.held
		l.pending, l.held = "", 0
		l.Write(state, n)
		return
	}
	l.pending = state
	l.held++
	if l.timer == nil {
		l.timer = time.AfterFunc(l.every(), l.flush)
	}
}

// flush writes the pending state once its interval is over.
func (l *Latest) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = nil
	if l.stopped || l.pending == "" {
		return
	}
	if ok, _ := l.throttle.Allow(l.now()); !ok { // Now lags the timer's clock: try again
		l.timer = time.AfterFunc(l.every(), l.flush)
		return
	}
	state, n := l.pending, l.held-1 // the state written was one of those held back
	l.pending, l.held = "", 0
	l.Write(state, n)
}

// Stop drops a pending state and its timer; Record does nothing after it.
func (l *Latest) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}

func (l *Latest) every() time.Duration {
	if l.Every <= 0 {
		return time.Second
	}
	return l.Every
}

func (l *Latest) now() time.Time {
	if l.Now == nil {
		return time.Now()
	}
	return l.Now()
}
