package server_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// envoyOverrideRules: 2 an hour per user of the shop, and at most 1
// stream in flight per user.
const envoyOverrideRules = `domain: shop
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 2, align: first_request }
  - key: tenant
    descriptors:
      - key: request_id
        rate_limit:
          sluice_in_flight: { limit: 1, lease_ttl: 1m }
`

// TestOverridesEnvoySubject: a tenant plan names a subject as the Envoy
// service sees it (a descriptor of a domain), through the admin API; the
// service applies it to that subject alone, and DELETE takes it back. A
// config file's override names one likewise. On memory and Redis.
func TestOverridesEnvoySubject(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testOverridesEnvoySubject(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testOverridesEnvoySubject(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
}

func testOverridesEnvoySubject(t *testing.T, store string) {
	dir := t.TempDir()
	cfg := overridesConfig(store) + `  - { envoy: { domain: shop, entries: [{ key: user, value: vip }] }, limit: 4, note: vip from the config }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
`
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg, "rules/shop.yaml": envoyOverrideRules})
	s := startRunWith(t, server.RunOptions{ConfigPath: filepath.Join(dir, "sluice.yaml"), Getenv: func(k string) string { return overrideEnv[k] }}, "")
	c := envoyClient(t, s)
	ask := func(entries ...string) string { t.Helper(); code, _ := askHits(t, c, nil, entries...); return code }
	remaining := func(entries ...string) uint32 {
		t.Helper()
		_, rem := askHits(t, c, wrapperspb.UInt64(0), entries...)
		return rem
	}
	admitted := func(n int, entries ...string) int {
		t.Helper()
		ok := 0
		for range n {
			if ask(entries...) == "OK" {
				ok++
			}
		}
		return ok
	}
	code, body := call(t, "PUT", s.url+"/v1/overrides", ovrAdminToken, `{"envoy":{"domain":"shop","entries":[{"key":"user","value":"acme"}]},"limit":5,"note":"acme: enterprise"}`)
	if code != 200 || !strings.Contains(body, `"policy":"shop.user"`) || strings.Contains(body, "acme\"") {
		t.Fatalf("PUT an envoy override = %d %s, want 200 naming policy shop.user and no subject", code, body)
	}
	waitUntil(t, "the plan reaches the Envoy service", func() bool { return remaining("user", "acme") == 5 })
	if n := admitted(10, "user", "acme"); n != 5 {
		t.Errorf("acme under its plan of 5: %d admitted, want 5", n)
	}
	if n := admitted(10, "user", "other"); n != 2 {
		t.Errorf("another user: %d admitted, want the rule's 2", n)
	}
	if n := admitted(10, "user", "vip"); n != 4 {
		t.Errorf("vip under the config file's plan of 4: %d admitted, want 4", n)
	}
	if code, body := call(t, "GET", s.url+"/v1/overrides?policy=shop.user", ovrAdminToken, ""); code != 200 || !strings.Contains(body, `"source":"config"`) || strings.Contains(body, "vip\"") {
		t.Errorf("GET the overrides of shop.user = %d %s, want the config file's, without its subject", code, body)
	}
	// In flight: a plan of 2 for one tenant; the lease entry's value is ignored.
	code, body = call(t, "PUT", s.url+"/v1/overrides", ovrAdminToken, `{"policy":"shop.tenant.request_id","envoy":{"domain":"shop","entries":[{"key":"tenant","value":"t1"},{"key":"request_id","value":"any"}]},"limit":2}`)
	if code != 200 {
		t.Fatalf("PUT an in-flight envoy override = %d %s", code, body)
	}
	waitUntil(t, "two streams in flight for t1", func() bool {
		return ask("tenant", "t1", "request_id", "a") == "OK" && ask("tenant", "t1", "request_id", "b") == "OK"
	})
	if got := ask("tenant", "t1", "request_id", "c"); got != "OVER_LIMIT" {
		t.Errorf("a third stream of t1 = %s, want OVER_LIMIT", got)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"envoy":{"domain":"shop","entries":[{"key":"nope","value":"x"}]},"limit":5}`, "no rule of domain"},
		{`{"envoy":{"domain":"other","entries":[{"key":"user","value":"x"}]},"limit":5}`, "no rules file holds it"},
		{`{"policy":"api","envoy":{"domain":"shop","entries":[{"key":"user","value":"x"}]},"limit":5}`, `the descriptor's rule has policy`},
		{`{"subject":"x","envoy":{"domain":"shop","entries":[{"key":"user","value":"x"}]},"limit":5}`, "not both"},
	} {
		if code, body := call(t, "PUT", s.url+"/v1/overrides", ovrAdminToken, tc.body); code < 400 || !strings.Contains(body, tc.want) {
			t.Errorf("PUT %s = %d %s, want an error %q", tc.body, code, body, tc.want)
		}
	}
	if code, body := call(t, "DELETE", s.url+"/v1/overrides", ovrAdminToken, `{"envoy":{"domain":"shop","entries":[{"key":"user","value":"acme"}]}}`); code != 200 {
		t.Fatalf("DELETE the envoy override = %d %s", code, body)
	}
	waitUntil(t, "the plan leaves the Envoy service", func() bool { return ask("user", "acme") == "OVER_LIMIT" })
}

// askHits asks the Envoy service c about one descriptor of domain shop
// with the descriptor's hits_addend hits (nil: none) and returns the
// overall code and the descriptor's limit_remaining.
func askHits(t *testing.T, c rlspb.RateLimitServiceClient, hits *wrapperspb.UInt64Value, entries ...string) (string, uint32) {
	t.Helper()
	var es []*commonpb.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(entries); i += 2 {
		es = append(es, &commonpb.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: es, HitsAddend: hits}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.OverallCode.String(), resp.Statuses[0].LimitRemaining
}
