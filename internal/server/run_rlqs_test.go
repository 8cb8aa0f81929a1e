package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
)

const rlqsConfig = `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: per-tenant, algorithm: token_bucket, limit: 100, window: 1s, burst: 200 }
envoy:
  listen: "127.0.0.1:0"
  rlqs:
    round: 100ms
    domains:
      - domain: edge
        buckets:
          - match: { tenant: "*" }
            policy: per-tenant
overrides:
  - { rlqs: { domain: edge, bucket: { tenant: gold } }, limit: 1000, burst: 2000 }
`

// TestServeRLQS serves Envoy's quota service from a config with only
// envoy.rlqs: a proxy's buckets get the policy (less the floor left free
// for a newcomer), a planned tenant its plan's numbers, and a stop tells
// the proxy its assignments expire now.
func hasTokenBucket(st envoyrlqs.State, max, per uint32, every int64) bool {
	tb := st.Strategy.GetTokenBucket()
	return st.Phase == envoyrlqs.Assignment && tb.GetMaxTokens() == max && tb.GetTokensPerFill().GetValue() == per && tb.GetFillInterval().GetSeconds() == every
}

func TestServeRLQS(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": rlqsConfig})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	m := envoyLine.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no envoy listening line:\n%s", s.logs)
	}
	p, err := envoyrlqs.Dial(m[1], envoyrlqs.Options{Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plain, gold := map[string]string{"tenant": "a"}, map[string]string{"tenant": "gold"}
	p.Admit(plain)
	p.Admit(gold)
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id       map[string]string
		max, per uint32
		every    int64 // fill_interval's whole seconds
	}{
		// At once the floor, then after a round one stream alone, with
		// one floor of 1/16 left free for a newcomer: 15/16 (93.75/s as
		// 375 tokens every 4 s, 937.5/s as 1875 every 2 s).
		{plain, 187, 375, 4},
		{gold, 1875, 1875, 2},
	} {
		// The answers and pushes until the round's arrives.
		st, err := p.AwaitState(ctx, c.id, func(st envoyrlqs.State) bool { return hasTokenBucket(st, c.max, c.per, c.every) })
		if err != nil {
			t.Fatalf("bucket %v = %+v, want a token bucket of %d tokens, %d every %d s: %v", c.id, st, c.max, c.per, c.every, err)
		}
	}
	// The first answers, at once: the same fraction of each bucket's
	// numbers, the plan's for gold (the plans are read before the first
	// report).
	first := map[string]uint32{}
	for _, e := range p.Events() {
		if k := e.Key; e.Kind == envoyrlqs.Assigned && first[k] == 0 {
			first[k] = e.Strategy.GetTokenBucket().GetMaxTokens()
		}
	}
	if a, g := first[envoyrlqs.Key(plain)], first[envoyrlqs.Key(gold)]; a == 0 || g != 10*a {
		t.Fatalf("first answers: %d tokens for a, %d for gold, want ten times a's for gold", a, g)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := p.Await(ctx); err != nil {
		t.Logf("after stop: %v", err)
	}
	var expired bool
	for _, e := range p.Events() {
		expired = expired || e.TTL == 0 && e.Kind == envoyrlqs.Refreshed || e.Kind == envoyrlqs.AssignmentExpired
	}
	if !expired {
		t.Fatalf("after stop, no assignment expired: %+v", p.Events())
	}
}
