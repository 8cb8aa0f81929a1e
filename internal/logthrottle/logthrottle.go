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
