package wiring

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logthrottle"
)

// skippedOverrides counts the fields of the store's overrides hash that
// a read skipped as unreadable (sluice_overrides_skipped_total) and logs
// each distinct one once, at most skippedLogBurst lines per minute: the
// hash is read again at every change of the overrides, and a field
// written by a later sluice stays until it is removed. Safe for
// concurrent use.
type skippedOverrides struct {
	n        atomic.Int64
	log      *slog.Logger
	clock    sluice.Clock
	throttle logthrottle.Throttle
	mu       sync.Mutex
	seen     map[string]bool // reasons logged, at most skippedSeenMax
}

const (
	skippedLogBurst = 5
	skippedSeenMax  = 1000
)

func newSkippedOverrides(log *slog.Logger, clock sluice.Clock) *skippedOverrides {
	return &skippedOverrides{log: log, clock: clock, seen: map[string]bool{},
		throttle: logthrottle.Throttle{Every: time.Minute, Burst: skippedLogBurst}}
}

// record counts one skipped field, and logs it unless it was logged.
func (k *skippedOverrides) record(err error) {
	k.n.Add(1)
	why := err.Error()
	k.mu.Lock()
	if k.seen[why] || len(k.seen) >= skippedSeenMax {
		k.mu.Unlock()
		return
	}
	k.seen[why] = true
	k.mu.Unlock()
	if ok, held := k.throttle.Allow(k.clock.Now()); ok {
		k.log.Warn("an override in the store is unreadable and skipped: the others apply; remove or rewrite it", "reason", why, "not_logged", held)
	}
}
