package server

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/config"
)

// TestRestartOnlyRLQSKeys: the quota service names each bucket by its
// pseudonym under the keys it started with, and keeps it for the bucket's
// life, so a reload that changed subjects.hmac_keys would leave plans
// (named under the new keys) missing its buckets. With envoy.rlqs, the
// keys are fixed until restart; without it they still reload.
func TestRestartOnlyRLQSKeys(t *testing.T) {
	const base = `
policies:
  - { id: p, algorithm: token_bucket, limit: 100, window: 1s, burst: 200 }
subjects:
  hmac_keys:
    - { id: KEY, secret_env: SECRET }
`
	const rlqs = `envoy:
  listen: "127.0.0.1:0"
  rlqs:
    domains:
      - domain: edge
        buckets:
          - { match: { tenant: "*" }, policy: p }
`
	parse := func(s string) *config.Config {
		t.Helper()
		c, err := config.Parse(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	k1, k2 := strings.Replace(base, "KEY", "k1", 1), strings.Replace(base, "KEY", "k2", 1)
	if err := restartOnly(parse(k1), parse(k2)); err != nil {
		t.Errorf("without envoy.rlqs, new hmac_keys: %v, want a reload", err)
	}
	if err := restartOnly(parse(k1+rlqs), parse(k1+rlqs)); err != nil {
		t.Errorf("with envoy.rlqs, the same keys: %v, want a reload", err)
	}
	err := restartOnly(parse(k1+rlqs), parse(k2+rlqs))
	if err == nil || !strings.Contains(err.Error(), "subjects.hmac_keys changed") {
		t.Errorf("with envoy.rlqs, new hmac_keys: %v, want a restart-only refusal", err)
	}
}
