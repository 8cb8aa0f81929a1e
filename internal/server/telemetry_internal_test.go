package server

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

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
