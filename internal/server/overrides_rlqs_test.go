package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
)

// rlqsAdminConfig is overridesConfig's tokens, HMAC key and store with
// Envoy's quota service: domain edge, each tenant a bucket of per-tenant
// (100 a second, burst 200), and a config-file plan for tenant gold.
func rlqsAdminConfig(store string) string {
	return strings.Replace(overridesConfig(store), "  - { id: conc,", "  - { id: per-tenant, algorithm: token_bucket, limit: 100, window: 1s, burst: 200 }\n  - { id: conc,", 1) +
		`  - { rlqs: { domain: edge, bucket: { tenant: gold } }, limit: 1000, burst: 2000, note: gold from the config }
envoy:
  listen: "127.0.0.1:0"
  rlqs:
    round: 100ms
    domains:
      - domain: edge
        buckets:
          - match: { tenant: "*" }
            policy: per-tenant
`
}

// startRLQSAdmin runs cfg (rlqsAdminConfig's, or a variant) and returns
// the server and a kit proxy of domain edge dialled to its Envoy
// listener.
func startRLQSAdmin(t *testing.T, cfg string) (*running, *envoyrlqs.Proxy) {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg})
	s := startRunWith(t, server.RunOptions{ConfigPath: filepath.Join(dir, "sluice.yaml"), Getenv: func(k string) string { return overrideEnv[k] }}, "")
	m := envoyLine.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no envoy listening line:\n%s", s.logs)
	}
	p, err := envoyrlqs.Dial(m[1], envoyrlqs.Options{Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return s, p
}

// awaitTokenBucket waits, on the server's answers and pushes, until p's
// bucket id holds a token bucket of max tokens, per every every seconds.
func awaitTokenBucket(ctx context.Context, t *testing.T, p *envoyrlqs.Proxy, id map[string]string, max, per uint32, every int64) {
	t.Helper()
	st, err := p.AwaitState(ctx, id, func(st envoyrlqs.State) bool { return hasTokenBucket(st, max, per, every) })
	if err != nil {
		t.Fatalf("bucket %v = %+v, want a token bucket of %d tokens, %d every %d s: %v", id, st, max, per, every, err)
	}
}

// rlqsBuckets GETs /v1/rlqs with query and returns the status and list.
func rlqsBuckets(t *testing.T, url, query string) (int, checkapi.RLQSList, string) {
	t.Helper()
	code, body := call(t, "GET", url+checkapi.RLQSPath+query, ovrAdminToken, "")
	var list checkapi.RLQSList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("GET %s%s = %d %s: %v", checkapi.RLQSPath, query, code, body, err)
	}
	return code, list, body
}

// TestOverridesRLQSBucket: a tenant plan names a bucket of Envoy's quota
// service through the admin API; the service splits the plan's numbers
// among the proxies from its next round, GET /v1/rlqs shows the bucket
// by its subject with what it is assigned, and DELETE brings the policy
// back.
func TestOverridesRLQSBucket(t *testing.T) {
	s, p := startRLQSAdmin(t, rlqsAdminConfig(""))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acme := map[string]string{"tenant": "acme-7731"}
	p.Admit(acme)
	// One stream alone gets the policy less one floor of 1/16 left free
	// for a newcomer: 15/16 of 200 tokens and of 100 a second.
	awaitTokenBucket(ctx, t, p, acme, 187, 375, 4)
	plan := `{"rlqs":{"domain":"edge","bucket":{"tenant":"acme-7731"}},"limit":1000,"burst":2000,"note":"enterprise"}`
	code, body := call(t, "PUT", s.url+"/v1/overrides", ovrAdminToken, plan)
	if code != 200 || !strings.Contains(body, `"policy":"per-tenant"`) || !strings.Contains(body, `"limit":1000`) || strings.Contains(body, "acme-7731") {
		t.Fatalf("PUT an rlqs plan = %d %s, want 200 naming policy per-tenant and no bucket value", code, body)
	}
	awaitTokenBucket(ctx, t, p, acme, 1875, 1875, 2)
	code, list, raw := rlqsBuckets(t, s.url, "")
	if code != 200 || len(list.Buckets) != 1 || list.Truncated || strings.Contains(raw, "acme-7731") {
		t.Fatalf("GET /v1/rlqs = %d %s, want 200 and the one bucket, without its bucket id", code, raw)
	}
	if b := list.Buckets[0]; b.Domain != "edge" || b.Policy != "per-tenant" || b.Subject == "" || b.Streams != 1 || b.Rate < 937 || b.Rate > 1000 || b.Burst < 1875 || b.Burst > 2000 || b.Allowed != 1 {
		t.Errorf("GET /v1/rlqs's bucket = %+v, want edge, per-tenant, its subject, 1 stream, ~937.5/s and ~1875 tokens of the plan, 1 allowed", b)
	}
	if code, body := call(t, "GET", s.url+"/v1/overrides?policy=per-tenant", ovrAdminToken, ""); code != 200 || !strings.Contains(body, `"note":"enterprise"`) || !strings.Contains(body, `"source":"config"`) {
		t.Errorf("GET the overrides of per-tenant = %d %s, want the API's and the config file's plans", code, body)
	}
	if code, body := call(t, "DELETE", s.url+"/v1/overrides", ovrAdminToken, `{"rlqs":{"domain":"edge","bucket":{"tenant":"acme-7731"}}}`); code != 200 {
		t.Fatalf("DELETE the rlqs plan = %d %s", code, body)
	}
	awaitTokenBucket(ctx, t, p, acme, 187, 375, 4)
	if code, body := call(t, "DELETE", s.url+"/v1/overrides", ovrAdminToken, `{"rlqs":{"domain":"edge","bucket":{"tenant":"gold"}}}`); code != http.StatusConflict {
		t.Errorf("DELETE the config file's rlqs plan = %d %s, want 409: remove it from the file", code, body)
	}
	if l := logLinesWith(s.logs.String(), "acme-7731"); l != "" {
		t.Errorf("the server's log carries the bucket value:\n%s", l)
	}
}

// TestRLQSBucketsLimit: GET /v1/rlqs lists at most ?limit= buckets,
// saying so, and refuses a limit out of 1 to 1000.
func TestRLQSBucketsLimit(t *testing.T) {
	s, p := startRLQSAdmin(t, rlqsAdminConfig(""))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 3 {
		p.Admit(map[string]string{"tenant": fmt.Sprintf("t%d", i)})
	}
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "three buckets listed", func() bool { _, l, _ := rlqsBuckets(t, s.url, ""); return len(l.Buckets) == 3 })
	if code, l, raw := rlqsBuckets(t, s.url, "?limit=2"); code != 200 || len(l.Buckets) != 2 || !l.Truncated {
		t.Errorf("GET /v1/rlqs?limit=2 = %d %s, want 2 buckets, truncated", code, raw)
	}
	for _, q := range []string{"?limit=0", "?limit=1001", "?limit=x"} {
		if code, l, raw := rlqsBuckets(t, s.url, q); code != 400 || !strings.Contains(l.Error, "limit") {
			t.Errorf("GET /v1/rlqs%s = %d %s, want 400 naming limit", q, code, raw)
		}
	}
	if code, _ := call(t, "GET", s.url+checkapi.RLQSPath, ovrCheckToken, ""); code != http.StatusForbidden {
		t.Errorf("GET /v1/rlqs with a check-scope token = %d, want 403", code)
	}
}
