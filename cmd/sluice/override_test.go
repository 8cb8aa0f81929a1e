package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestOverrideBinary runs two sluice serve processes on one real Redis
// and drives them with the real binary: sluice override set through the
// first raises a subject that spent 8 of 10 to 100, and sluice check
// through the second sees 92 left within a bounded wait; list shows the
// note and never the subject; rm restores the policy's numbers.
func TestOverrideBinary(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	t.Setenv("SLUICE_TEST_OVR_ADMIN", "admin-token-0123456789abcdef")
	t.Setenv("SLUICE_TEST_OVR_CHECK", "check-token-0123456789abcdef")
	t.Setenv("SLUICE_TEST_OVR_HMAC", "hmac-secret-0123456789abcdef0123456789")
	cfg := fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  auth:
    tokens:
      - { id: ops, secret_env: SLUICE_TEST_OVR_ADMIN, scopes: [admin] }
      - { id: app, secret_env: SLUICE_TEST_OVR_CHECK, scopes: [check] }
subjects:
  hmac_keys:
    - { id: k1, secret_env: SLUICE_TEST_OVR_HMAC }
store: { type: redis, redis: { url: "redis://%s/0" } }
policies:
  - { id: api, algorithm: fixed_window, limit: 10, window: 1m }
`, srv.Addr)
	if err := os.WriteFile(filepath.Join(dir, "sluice.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startChild(t, dir, "serve", "--config", "sluice.yaml")
	b := startChild(t, dir, "serve", "--config", "sluice.yaml")
	tenant := fmt.Sprintf("tenant-%d", time.Now().UnixNano())
	check := func(url string, cost int) (checkapi.Answer, int) {
		t.Helper()
		out, errOut, code := runBinary(t, dir, "check", "--url", url, "--token-env", "SLUICE_TEST_OVR_CHECK", "--policy", "api", "--subject", tenant, "--cost", fmt.Sprint(cost))
		var ans checkapi.Answer
		if err := json.Unmarshal([]byte(out), &ans); err != nil {
			t.Fatalf("sluice check = %d %q %q", code, out, errOut)
		}
		return ans, code
	}
	if ans, code := check(b.URL, 8); code != 0 || ans.Remaining != 2 {
		t.Fatalf("spend 8 of 10 through b: %+v, exit %d", ans, code)
	}
	out, errOut, code := runBinary(t, dir, "override", "set", "--url", a.URL, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--policy", "api", "--subject", tenant, "--limit", "100", "--note", "acme raised")
	if code != 0 || !strings.Contains(out, "acme raised") {
		t.Fatalf("sluice override set = %d %q %q", code, out, errOut)
	}
	deadline := time.Now().Add(5 * time.Second) // within about 1s; room for a loaded machine
	for {
		ans, _ := check(b.URL, 0)
		if ans.Limit == 100 {
			if ans.Remaining != 92 {
				t.Fatalf("through b after the raise: %+v, want 92 of 100 left", ans)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b still answers %+v 5s after sluice override set through a", ans)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, errOut, code = runBinary(t, dir, "override", "list", "--url", b.URL, "--token", "admin-token-0123456789abcdef", "--policy", "api")
	if code != 0 || !strings.Contains(out, "acme raised") || !strings.Contains(out, "100") || strings.Contains(out, tenant) {
		t.Fatalf("sluice override list = %d %q %q, want the note and never the subject", code, out, errOut)
	}
	_, errOut, code = runBinary(t, dir, "override", "set", "--url", a.URL, "--token-env", "SLUICE_TEST_OVR_CHECK", "--policy", "api", "--subject", tenant, "--limit", "5")
	if code != 2 || !strings.Contains(errOut, "403") {
		t.Fatalf("sluice override set with a check token = exit %d %q, want 2 and the 403", code, errOut)
	}
	_, errOut, code = runBinary(t, dir, "override", "set", "--url", a.URL, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--policy", "nope", "--subject", tenant, "--limit", "5")
	if code != 2 || !strings.Contains(errOut, "unknown policy") {
		t.Fatalf("sluice override set of an unknown policy = exit %d %q, want 2 and the reason", code, errOut)
	}
	out, errOut, code = runBinary(t, dir, "override", "rm", "--url", a.URL, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--policy", "api", "--subject", tenant)
	if code != 0 || !strings.Contains(out, "removed") {
		t.Fatalf("sluice override rm = %d %q %q", code, out, errOut)
	}
	if ans, _ := check(a.URL, 0); ans.Limit != 10 {
		t.Fatalf("through a after rm: %+v, want the policy's 10", ans)
	}
	if _, errOut, code := runBinary(t, dir, "override", "set", "--policy", "api"); code != 2 || !strings.Contains(errOut, "needs --policy and --subject") {
		t.Fatalf("sluice override set without --subject = exit %d %q", code, errOut)
	}
}
