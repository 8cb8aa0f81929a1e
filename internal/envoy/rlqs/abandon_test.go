package rlqs

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
	"github.com/sluicehq/sluice/subject"
)

// TestAbandonKeepsCommittedUntilApplied: an abandoned bucket's Envoy
// enforces its assignment until the abandon arrives (within a round,
// assumption 1 of docs/rlqs.md), so its share stays committed until the
// round after next, as a decrease's does; given to another stream at the
// next round, the two would sum above the policy.
func TestAbandonKeepsCommittedUntilApplied(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	a, b := h.client("edge"), h.client("edge")
	for range 3 {
		a.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		h.round()
		h.advance(time.Second)
	}
	ra, _ := tokens(t, a.action(tenantA))
	for range 3 {
		a.report(usage{id: tenantA, elapsed: 5 * time.Second})
	}
	if a.action(tenantA).GetAbandonAction() == nil {
		t.Fatalf("after three idle reports, %v, want an abandon", a.action(tenantA))
	}
	h.round()
	b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	if rb, _ := tokens(t, b.action(tenantA)); ra+rb > 100 {
		t.Fatalf("a's %v/s (its abandon on its way) + b's %v/s = %v/s, above the policy's 100/s", ra, rb, ra+rb)
	}
	// The round after, a's abandon has been applied: b may have it all.
	h.round()
	h.round()
	b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	if rb, _ := tokens(t, b.action(tenantA)); rb <= 100-ra {
		t.Fatalf("two rounds after a's abandon, b has %v/s, want a's share too (more than %v/s)", rb, 100-ra)
	}
}

// TestFirstReportDuringARoundIsAnswered: a stream's first report of a
// bucket that arrives while a round waits on the ledger is answered at
// once, by its own claim after the round's, not left to the next round
// (the round's end used to clear the bucket's fresh mark).
func TestFirstReportDuringARoundIsAnswered(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	g := &gated{Ledger: ledger.NewMemory(h.clock.Now), entered: make(chan struct{}, 1), open: make(chan struct{})}
	h.svc.ledger = g
	a, b := h.client("edge"), h.client("edge")
	a.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	g.arm()
	rounded := make(chan struct{})
	go func() { h.round(); close(rounded) }()
	<-g.entered // the round's claim is under way
	probe := map[string]string{"probe": "b"}
	if err := b.send(usage{id: tenantA, allowed: 1}, usage{id: probe}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !holds(h.svc, 2) { // b's report taken: its claim waits for the round's
		if ctx.Err() != nil {
			t.Fatal("b's first report was never taken")
		}
		runtime.Gosched()
	}
	close(g.open)
	<-rounded
	for b.action(probe) == nil {
		b.next()
	}
	if b.action(tenantA).GetQuotaAssignmentAction() == nil {
		t.Fatalf("b's first report of the bucket, during a round: %v, want an assignment at once", b.action(tenantA))
	}
}

// holds reports whether svc's one bucket is held by n streams.
func holds(svc *Service, n int) bool {
	vs := svc.Buckets(0)
	return len(vs) == 1 && vs[0].Streams == n
}

// TestOverflowTakesThePlan: a planned bucket past a cap gets the
// overflow answer of its plan, not of the matcher's policy.
func TestOverflowTakesThePlan(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBucketsPerStream = 1
	tenantB := map[string]string{"tenant": "b", "route": "api"}
	plan := sluice.Override{Policy: "per-tenant", Subject: Subject(subject.Unkeyed(), "edge", tenantB), Limit: 10}
	h := newHarness(t, cfg, Options{Overrides: func(context.Context) ([]sluice.Override, error) { return []sluice.Override{plan}, nil }})
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 1, elapsed: time.Second}, usage{id: tenantB, allowed: 1, elapsed: time.Second})
	if rate, burst := tokens(t, c.action(tenantB)); rate != 10 || burst != 10 {
		t.Fatalf("a planned bucket past the cap: %v/s max %d, want its plan over 1 stream: 10/s, 10", rate, burst)
	}
}

// TestPlanLoweringConvergesAcrossInstances: two instances on one ledger,
// each with one stream of a bucket, each stream's share kept by the 10 %
// hysteresis when a plan lowers the policy by less than that. Each
// instance's own sum stays under the new policy, so only the ledger can
// tell that their sum does not: an instance the ledger grants less than
// it wishes fits its streams into the grant.
func TestPlanLoweringConvergesAcrossInstances(t *testing.T) {
	var mu sync.Mutex
	var plans []sluice.Override
	read := func(context.Context) ([]sluice.Override, error) {
		mu.Lock()
		defer mu.Unlock()
		return plans, nil
	}
	x := newHarness(t, testConfig(), Options{Overrides: read})
	shared := ledger.NewMemory(x.clock.Now)
	x.svc.ledger = shared
	y := newHarness(t, testConfig(), Options{Overrides: read})
	y.svc.ledger = shared
	cx, cy := x.client("edge"), y.client("edge")
	both := func() float64 {
		for range 3 {
			cx.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
			cy.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
			x.round()
			y.round()
		}
		cx.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		cy.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		rx, _ := tokens(t, cx.action(tenantA))
		ry, _ := tokens(t, cy.action(tenantA))
		return rx + ry
	}
	if sum := both(); sum > 100 {
		t.Fatalf("under the policy of 100/s, the two streams hold %v/s", sum)
	}
	mu.Lock()
	plans = []sluice.Override{{Policy: "per-tenant", Subject: Subject(subject.Unkeyed(), "edge", tenantA), Limit: 92}}
	mu.Unlock()
	both()
	if sum := both(); sum > 92 {
		t.Fatalf("rounds after a plan of 92/s, the two instances' streams hold %v/s", sum)
	}
}
