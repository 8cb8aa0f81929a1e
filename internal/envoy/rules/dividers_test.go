package rules

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestLongUnitsKeepEnvoysDividers: week, month and year are
// envoyproxy/ratelimit's fixed dividers (utils.UnitToDivider: 7, 30 and
// 365 days), windows aligned to multiples of them since the epoch as its
// cache keys are, not calendar periods, so a migrated file answers the
// same. The year is sluice's longest window (algorithm.MaxWindow).
func TestLongUnitsKeepEnvoysDividers(t *testing.T) {
	src := []byte(`domain: d
descriptors:
  - key: w
    rate_limit: {unit: week, requests_per_unit: 5}
  - key: m
    rate_limit: {unit: MONTH, requests_per_unit: 5}
  - key: y
    rate_limit: {unit: year, requests_per_unit: 5}
`)
	c, err := Parse([]Source{{Name: "long.yaml", Data: src}})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := map[string]struct {
		unit   Unit
		window time.Duration
		proto  int // envoy.service.ratelimit.v3 RateLimitResponse.RateLimit.Unit
	}{
		"w": {Week, 604800 * time.Second, 7},
		"m": {Month, 2592000 * time.Second, 5},
		"y": {Year, 31536000 * time.Second, 6},
	}
	for _, r := range c.Rules() {
		w, ok := want[r.Key[len("d."):]]
		if !ok {
			t.Fatalf("unexpected rule %q", r.Key)
		}
		if r.Unit != w.unit || int(r.Unit) != w.proto || r.Policy.Window != w.window || !r.Policy.ClockAligned || r.Policy.Algorithm != sluice.FixedWindow {
			t.Errorf("rule %q = unit %v (%d), %+v; want unit %v (%d), a fixed window of %v aligned to the clock", r.Key, r.Unit, r.Unit, r.Policy, w.unit, w.proto, w.window)
		}
		if err := r.Policy.Validate(); err != nil {
			t.Errorf("rule %q: Validate = %v", r.Key, err)
		}
	}
	over := sluice.Policy{ID: "y", Algorithm: sluice.FixedWindow, Limit: 5, Window: Year.Duration() + time.Microsecond, ClockAligned: true}
	if err := over.Validate(); err == nil {
		t.Errorf("a window 1µs longer than envoyproxy/ratelimit's year: Validate = nil, want the 365-day bound")
	}
}
