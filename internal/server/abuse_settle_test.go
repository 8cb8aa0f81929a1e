package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestAbuseSettle plays the settle row's hostile caller (docs/security.md)
// over the check API on real sockets, holding only the check scope: it
// spends a gcra policy of 5 an hour (victim) to its end, then three times
// estimates 5 on two policies it may spend freely and settles at 0 naming
// victim instead (in place of the second, beside both, and first). The
// bound: whatever a settle names, it gives back only what its own
// estimate spent, so victim admits 5 in all; each such settle is a 400
// naming the rule, and the estimate can still be settled as spent.
func TestAbuseSettle(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testAbuseSettle(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testAbuseSettle(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
}

func testAbuseSettle(t *testing.T, store string) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	cfg := `server:
  listen: 127.0.0.1:0
  auth:
    tokens:
      - { id: app, secret_env: OVR_CHECK, scopes: [check] }
` + store + `
policies:
  - { id: a, algorithm: gcra, limit: 1000, window: 1h, dedupe_ttl: 10m }
  - { id: b, algorithm: gcra, limit: 1000, window: 1h }
  - { id: victim, algorithm: gcra, limit: 5, window: 1h }
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startRunWith(t, server.RunOptions{ConfigPath: path, Getenv: func(k string) string { return overrideEnv[k] }}, "").url
	subject := fmt.Sprintf("hostile-%s", t.Name())
	post := func(body string) (int, checkapi.Answer, string) {
		t.Helper()
		code, raw := call(t, "POST", url+"/v1/check", ovrCheckToken, body)
		a, err := checkapi.ParseAnswer([]byte(raw))
		if err != nil {
			t.Fatalf("POST %s = %d %s: %v", body, code, raw, err)
		}
		return code, a, raw
	}
	admitted := 0
	drain := func() {
		t.Helper()
		for range 30 {
			code, _, raw := post(fmt.Sprintf(`{"policy":"victim","subject":%q}`, subject))
			switch code {
			case 200:
				admitted++
			case 429:
				return
			default:
				t.Fatalf("spend of victim = %d %s, want 200 or 429", code, raw)
			}
		}
		t.Fatalf("victim admitted 30 spends in a row, a policy of 5 an hour")
	}
	drain()
	for i, names := range []string{`"a","victim"`, `"a","b","victim"`, `"victim","b"`} {
		id := fmt.Sprintf("x-%d", i)
		if code, _, raw := post(fmt.Sprintf(`{"policies":["a","b"],"subject":%q,"op":"estimate","cost":5,"evaluation_id":%q}`, subject, id)); code != 200 {
			t.Fatalf("estimate 5 on a, b = %d %s, want 200", code, raw)
		}
		code, a, raw := post(fmt.Sprintf(`{"policies":[%s],"subject":%q,"op":"settle","cost":0,"evaluation_id":%q}`, names, subject, id))
		if code != 400 || a.Outcome != "incompatible" || !strings.Contains(a.Reason, "evaluation id") {
			t.Errorf("settle at 0 naming [%s] after an estimate on a, b = %d %s, want 400, incompatible, naming the evaluation id", names, code, raw)
		}
		drain()
	}
	if admitted != 5 {
		t.Fatalf("victim admitted %d spends under three hostile estimate/settle pairs, want 5: the bound is its own limit", admitted)
	}
	if code, a, raw := post(fmt.Sprintf(`{"policies":["a","b"],"subject":%q,"op":"settle","cost":0,"evaluation_id":"x-0"}`, subject)); code != 200 || len(a.Statuses) != 2 || a.Statuses[0].GivenBack != 5 || a.Statuses[1].GivenBack != 5 {
		t.Fatalf("settle at 0 naming the estimate's a, b = %d %s, want 200 giving 5 back to each", code, raw)
	}
}
