package rlqs

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// erring wraps a ledger, keeping the errors of its calls.
type erring struct {
	ledger.Ledger
	mu   sync.Mutex
	errs []error
}

func (e *erring) Claim(ctx context.Context, domain, instance string, cs []ledger.Claim, ttl time.Duration) ([]ledger.Grant, error) {
	gs, err := e.Ledger.Claim(ctx, domain, instance, cs, ttl)
	if err != nil {
		e.mu.Lock()
		e.errs = append(e.errs, err)
		e.mu.Unlock()
	}
	return gs, err
}

// TestAbuseRLQSStream plays hostile Envoy streams (RLQS takes no token:
// whoever reaches the Envoy listener is a stream) against the service on
// the Redis ledger, beside an honest one, and checks the bound whatever
// they send: the shares of a bucket sum to at most its policy; the
// honest stream keeps at least its floor; the ledger keeps answering
// (a report's counts cannot make a claim the ledger refuses); a stream's
// invented bucket ids past its cap get the overflow answer and no state.
func TestAbuseRLQSStream(t *testing.T) {
	srv, err := redistest.StartServer("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	rc := srv.Client()
	t.Cleanup(func() { rc.Close() })
	cfg := testConfig()
	cfg.MaxBucketsPerStream = 20
	h := newHarness(t, cfg, Options{})
	r, err := ledger.NewRedis(rc, "")
	if err != nil {
		t.Fatal(err)
	}
	led := &erring{Ledger: r}
	h.svc.ledger = led
	honest, greedy, greedy2 := h.client("edge"), h.client("edge"), h.client("edge")
	for round := range 6 {
		honest.report(usage{id: tenantA, allowed: 20, elapsed: 5 * time.Second})
		// the most a report can claim: every count at its largest, over 0 s
		greedy.report(usage{id: tenantA, allowed: math.MaxUint64, denied: math.MaxUint64, elapsed: 0})
		greedy2.report(usage{id: tenantA, allowed: math.MaxUint64, elapsed: time.Second})
		h.round()
		var rate float64
		var burst uint32
		for _, c := range []*client{honest, greedy, greedy2} {
			if tb := c.action(tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil {
				r, b := tokens(t, c.action(tenantA))
				rate, burst = rate+r, burst+b
			}
		}
		if rate > 100 || burst > 100 {
			t.Fatalf("round %d: the streams hold %v/s and %d tokens of a policy of 100/s, 100", round, rate, burst)
		}
	}
	led.mu.Lock()
	errs := led.errs
	led.mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("the ledger refused %d claims, the first: %v", len(errs), errs[0])
	}
	// 3 streams: the floor is 1/(8·4) of 100/s, rounded down.
	if r, _ := tokens(t, honest.action(tenantA)); r < 3 {
		t.Fatalf("the honest stream holds %v/s beside greedy ones, want at least its floor, 3/s", r)
	}
	for i := range 200 {
		id := map[string]string{"tenant": fmt.Sprint("invented-", i), "route": "api"}
		greedy.report(usage{id: id, allowed: 1, elapsed: time.Second})
	}
	if n := len(h.svc.Buckets(0)); n > cfg.MaxBucketsPerStream+1 {
		t.Fatalf("%d buckets kept after one stream invented 200 ids, want at most its cap %d and the shared bucket", n, cfg.MaxBucketsPerStream)
	}
}
