package rlqs

import (
	"context"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
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

// gated wraps a ledger: while armed, a Claim signals entered and waits
// for open to close.
type gated struct {
	ledger.Ledger
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	open    chan struct{}
}

func (g *gated) Claim(ctx context.Context, domain, instance string, cs []ledger.Claim, ttl time.Duration) ([]ledger.Grant, error) {
	g.mu.Lock()
	armed := g.armed
	g.armed = false
	g.mu.Unlock()
	if armed {
		g.entered <- struct{}{}
		<-g.open
	}
	return g.Ledger.Claim(ctx, domain, instance, cs, ttl)
}

func (g *gated) arm() {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
}

func ttlOf(a *rlqspb.RateLimitQuotaResponse_BucketAction) time.Duration {
	return a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()
}

// TestNoAssignmentAfterShutdownsTTLZero: a report being answered when
// Shutdown begins (here: its first-report claim under way) must not send
// an assignment after the TTL 0 that Shutdown sent: its Envoy would
// enforce it for a whole TTL while this instance releases its ledger
// entries a round later, and another instance regives the share.
func TestNoAssignmentAfterShutdownsTTLZero(t *testing.T) {
	asked, fire := make(chan struct{}, 1), make(chan time.Time, 1)
	h := newHarness(t, testConfig(), Options{after: func(time.Duration) <-chan time.Time { asked <- struct{}{}; return fire }})
	g := &gated{Ledger: ledger.NewMemory(h.clock.Now), entered: make(chan struct{}, 1), open: make(chan struct{})}
	h.svc.ledger = g
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	h.round()
	h.advance(time.Second)
	c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	h.svc.mu.Lock()
	var st *stream
	for s := range h.svc.all {
		st = s
	}
	h.svc.mu.Unlock()

	tenantB := map[string]string{"tenant": "b", "route": "api"}
	g.arm()
	if err := c.send(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second}, usage{id: tenantB, allowed: 1}); err != nil {
		t.Fatal(err)
	}
	<-g.entered // the report's first-report claim (for b) is under way
	done := make(chan struct{})
	go func() { h.svc.Shutdown(context.Background()); close(done) }()
	for a := c.action(tenantA); ttlOf(a) != 0; a = c.action(tenantA) {
		c.next()
	}
	<-asked // TTL 0 sent; Shutdown waits a round before it releases
	close(g.open)
	if err := c.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	<-h.left // the report was answered, then the stream ended
	var late []string
	for {
		select {
		case m := <-c.msgs:
			for _, a := range m.GetBucketAction() {
				if ttlOf(a) > 0 {
					late = append(late, "sent: "+a.String())
				}
			}
			continue
		case <-c.errc:
		}
		break
	}
	st.out.mu.Lock()
	for _, a := range st.out.acts {
		if ttlOf(a) > 0 {
			late = append(late, "queued: "+a.String())
		}
	}
	st.out.mu.Unlock()
	fire <- time.Time{}
	<-done
	if len(late) > 0 {
		t.Fatalf("after Shutdown's TTL 0, %d assignments with a TTL: %v", len(late), late)
	}
}
