package rlqs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestPlanLoweringWithinHysteresisTakesEffect: a plan that lowers a
// bucket's numbers by less than the hysteresis' 10 % must still bring the
// assignments under the new numbers: a stream held at its old assignment
// above the policy admits more than the policy for as long as it is held,
// and the ledger reserves that assignment (it is committed), so the
// reservations exceed the policy too.
func TestPlanLoweringWithinHysteresisTakesEffect(t *testing.T) {
	var mu sync.Mutex
	var plans []sluice.Override
	h := newHarness(t, testConfig(), Options{Overrides: func(context.Context) ([]sluice.Override, error) {
		mu.Lock()
		defer mu.Unlock()
		return plans, nil
	}})
	c := h.client("edge")
	for range 3 {
		c.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		h.round()
		h.advance(time.Second)
	}
	c.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	if rate, _ := tokens(t, c.action(tenantA)); rate < 93 {
		t.Fatalf("alone with demand: %v/s, want 15/16 of 100/s", rate)
	}
	mu.Lock()
	plans = []sluice.Override{{Policy: "per-tenant", Subject: h.svc.Buckets(0)[0].Subject, Limit: 90, Burst: 90}}
	mu.Unlock()
	for range 3 {
		h.round()
		h.advance(time.Second)
		c.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	}
	if rate, burst := tokens(t, c.action(tenantA)); rate > 90 || burst > 90 {
		t.Fatalf("three rounds under a plan of 90/s, 90: %v/s max %d, above the plan", rate, burst)
	}
}
