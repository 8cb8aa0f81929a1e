package edge

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestProblemDetail: a 429's detail says seconds up to an hour and the
// date past it, on the Core's clock, rounded up to the second.
func TestProblemDetail(t *testing.T) {
	clock := sluicetest.NewClock()
	clock.Set(time.Date(2026, 3, 10, 11, 0, 0, 250e6, time.FixedZone("CET", 3600)))
	c, err := New(nil, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name   string
		wait   time.Duration
		detail string
	}{
		{"seconds", 7500 * time.Millisecond, "Too many requests; retry in 8 s."},
		{"an hour", time.Hour - 250*time.Millisecond, "Too many requests; retry in 3600 s."},
		{"past an hour", time.Hour + 250*time.Millisecond, "Too many requests; retry after 2026-03-10T11:00:01Z."},
		{"a month", 21*24*time.Hour + 14*time.Hour - 250*time.Millisecond, "Too many requests; retry after 2026-04-01T00:00:00Z."},
	} {
		a := Action{Kind: Limit, Outcome: sluice.Outcome{Kind: sluice.Denied, Status: sluice.Status{Policy: "plan", RetryAfter: step.wait}}}
		a.RetryAfter = ratelimitheader.RetryAfterSeconds(step.wait)
		if p := c.Problem(&a); p.Detail != step.detail || p.Status != 429 {
			t.Errorf("%s: Problem(RetryAfter %v) = %d %q, want 429 %q", step.name, step.wait, p.Status, p.Detail, step.detail)
		}
	}
}
