package server

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/sluicehq/sluice/sluicetest"
)

// TestOTelErrorsThrottled: 100 errors of the SDK in one interval are
// otelErrorBurst lines in the routed log; the next interval's first line
// counts those held back; after unroute the log gets none.
func TestOTelErrorsThrottled(t *testing.T) {
	var logs strings.Builder
	clock := sluicetest.NewClock()
	unroute := routeOTelErrors(slog.New(slog.NewTextHandler(&logs, nil)), clock)
	for range 100 {
		otel.Handle(errors.New("traces export: connection refused"))
	}
	if n := strings.Count(logs.String(), "\n"); n != otelErrorBurst {
		t.Fatalf("100 errors in one interval: %d lines, want %d:\n%s", n, otelErrorBurst, logs.String())
	}
	clock.Advance(otelErrorEvery)
	otel.Handle(errors.New("traces export: connection refused"))
	if !strings.Contains(logs.String(), "not_logged=97") {
		t.Fatalf("the next interval's line lacks not_logged=97:\n%s", logs.String())
	}
	unroute()
	before := logs.Len()
	otel.Handle(errors.New("after"))
	if logs.Len() != before {
		t.Fatalf("after unroute the log got %q", logs.String()[before:])
	}
}

// TestFlushDeadline: the spans left at shutdown are flushed for at most
// flushTimeout, whatever the collector does (one that accepts and never
// answers held SIGTERM for the drain's whole 10 s), and never past the
// drain's own deadline.
func TestFlushDeadline(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		drain, want time.Time
	}{
		{"no drain", time.Time{}, now.Add(flushTimeout)},
		{"the drain's 10s ahead", now.Add(shutdownTimeout), now.Add(flushTimeout)},
		{"the drain ends first", now.Add(time.Second), now.Add(time.Second)},
		{"the drain is over", now.Add(-time.Second), now.Add(-time.Second)},
	} {
		if got := flushDeadline(now, tc.drain); !got.Equal(tc.want) {
			t.Errorf("%s: flushDeadline(now, %v) = %v, want %v", tc.name, tc.drain, got, tc.want)
		}
	}
	if flushTimeout > 2*time.Second {
		t.Errorf("flushTimeout = %v, want at most 2s (issue 50: SIGTERM with a blackholed collector within 3s)", flushTimeout)
	}
}
