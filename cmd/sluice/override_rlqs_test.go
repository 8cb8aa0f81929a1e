package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
)

// TestOverrideRLQSBucket: sluice override set names a bucket of Envoy's
// quota service (--rlqs-domain, --bucket) and the service splits the
// plan's numbers to a proxy reporting it; rm takes them back. Flags
// that mix the forms or leave one half out are usage errors.
func TestOverrideRLQSBucket(t *testing.T) {
	t.Setenv("SLUICE_TEST_OVR_ADMIN", "admin-token-0123456789abcdef")
	cfg := writeConfig(t, `server:
  listen: 127.0.0.1:0
  auth:
    tokens: [{ id: ops, secret_env: SLUICE_TEST_OVR_ADMIN, scopes: [admin] }]
policies:
  - { id: per-tenant, algorithm: token_bucket, limit: 100, window: 1s, burst: 200 }
envoy:
  listen: "127.0.0.1:0"
  rlqs:
    round: 100ms
    domains:
      - domain: edge
        buckets:
          - match: { tenant: "*", route: "*" }
            policy: per-tenant
`)
	s := startServe(t, "--config", cfg)
	m := envoyListening.FindStringSubmatch(s.logs.String())
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
	id := map[string]string{"tenant": "acme", "route": "api"}
	// until p's bucket holds a token bucket of max tokens, per a second
	// (tokens_per_fill per whole second of fill_interval, as Envoy reads it)
	await := func(max uint32, per float64) {
		t.Helper()
		st, err := p.AwaitState(ctx, id, func(st envoyrlqs.State) bool {
			tb := st.Strategy.GetTokenBucket()
			return st.Phase == envoyrlqs.Assignment && tb.GetMaxTokens() == max &&
				float64(tb.GetTokensPerFill().GetValue())/float64(tb.GetFillInterval().GetSeconds()) == per
		})
		if err != nil {
			t.Fatalf("bucket = %+v, want %d tokens, %v a second: %v", st, max, per, err)
		}
	}
	p.Admit(id)
	await(187, 93.75) // 15/16 of the policy: one floor is left for a newcomer
	override := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := exitCode(run(context.Background(), append([]string{"override"}, args...), &out, &errOut), &errOut)
		return out.String(), errOut.String(), code
	}
	out, errOut, code := override("set", "--url", s.url, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--rlqs-domain", "edge", "--bucket", "tenant=acme", "--bucket", "route=api",
		"--limit", "1000", "--burst", "2000", "--note", "enterprise")
	if code != 0 || !strings.Contains(out, "per-tenant") || !strings.Contains(out, "enterprise") || strings.Contains(out, "acme") {
		t.Fatalf("override set --rlqs-domain = %d %q %q", code, out, errOut)
	}
	await(1875, 937.5)
	if _, errOut, code := override("rm", "--url", s.url, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--rlqs-domain", "edge", "--bucket", "tenant=acme", "--bucket", "route=api"); code != 0 {
		t.Fatalf("override rm --rlqs-domain = %d %q", code, errOut)
	}
	await(187, 93.75)
	_, errOut, code = override("set", "--url", s.url, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--rlqs-domain", "edge", "--bucket", "tenant=*", "--bucket", "route=api", "--limit", "1000")
	if code != 2 || !strings.Contains(errOut, "400") {
		t.Errorf(`override set --bucket tenant=* = exit %d %q, want 2 with the server's 400`, code, errOut)
	}
	for _, args := range [][]string{
		{"set", "--rlqs-domain", "edge", "--limit", "3"},
		{"set", "--bucket", "tenant=x", "--limit", "3"},
		{"set", "--rlqs-domain", "edge", "--bucket", "tenant=x", "--subject", "x", "--limit", "3"},
		{"set", "--rlqs-domain", "edge", "--bucket", "tenant=x", "--envoy-domain", "shop", "--descriptor", "user=x", "--limit", "3"},
		{"set", "--rlqs-domain", "edge", "--bucket", "novalue", "--limit", "3"},
		{"set", "--rlqs-domain", "edge", "--bucket", "tenant=x", "--bucket", "tenant=y", "--limit", "3"},
		{"list", "--rlqs-domain", "edge", "--bucket", "tenant=x"},
	} {
		if _, errOut, code := override(args...); code != 2 || !strings.Contains(errOut, "Usage") && !strings.Contains(errOut, "bucket") {
			t.Errorf("override %q = exit %d %q, want a usage error (2)", args, code, errOut)
		}
	}
}
