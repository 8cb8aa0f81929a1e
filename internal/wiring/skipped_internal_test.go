package wiring

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sluicetest"
)

// TestSkippedOverridesLogOnce: the same unreadable field, met at every
// read of the overrides hash, is counted each time and logged once; new
// ones are logged, at most skippedLogBurst a minute on the clock.
func TestSkippedOverridesLogOnce(t *testing.T) {
	var logs strings.Builder
	clock := sluicetest.NewClock()
	k := newSkippedOverrides(slog.New(slog.NewTextHandler(&logs, nil)), clock)
	bad := errors.New(`override field "x" = "2|5|0|0|": format "2"`)
	for range 3 {
		k.record(bad)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || k.n.Load() != 3 {
		t.Fatalf("3 reads of one bad field: %d lines, count %d; want 1 line, count 3:\n%s", n, k.n.Load(), logs.String())
	}
	for i := range 2 * skippedLogBurst {
		k.record(errors.New(strings.Repeat("y", i+1)))
	}
	if n := strings.Count(logs.String(), "\n"); n != skippedLogBurst {
		t.Fatalf("%d other bad fields in one minute: %d lines, want %d", 2*skippedLogBurst, n, skippedLogBurst)
	}
	clock.Advance(time.Minute)
	k.record(errors.New("z"))
	if got := logs.String(); !strings.Contains(got, "not_logged=") || strings.Count(got, "\n") != skippedLogBurst+1 {
		t.Fatalf("a minute later a new field is logged with the count held back:\n%s", got)
	}
}
