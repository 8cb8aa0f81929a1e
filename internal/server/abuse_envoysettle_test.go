package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestAbuseEnvoySettle plays the hostile caller of the settle via Envoy
// under sluice serve: an LLM tenant whose every call's stream-done call
// reports more than the rule's hourly budget (1 000 tokens). The bound:
// whatever the stream-done call reports, the tenant pays it up to the
// store's debt bound (a fixed window counts at most twice its limit in
// the window), as a caller of the check API's settle pays for the same
// numbers, never only its estimates. The settles, and the stream-done
// calls of estimates that were denied, are counted.
func TestAbuseEnvoySettle(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testAbuseEnvoySettle(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testAbuseEnvoySettle(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
}

// The hostile tenant's calls: each estimates abuseEstimate tokens and
// reports abuseActual on stream done, on a budget of abuseLimit an hour.
const (
	abuseCalls    = 10
	abuseEstimate = 100
	abuseActual   = 5000
	abuseLimit    = 1000
)

func testAbuseEnvoySettle(t *testing.T, store string) {
	dir := t.TempDir()
	cfg := strings.Replace(envoyConfig(store), "policies:\n", "policies:\n  - { id: tokens, algorithm: fixed_window, limit: 1000, window: 1h }\n", 1)
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg, "rules/ai.yaml": `domain: ai
descriptors:
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 1000, align: first_request, sluice_settle: true }
`})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	call := func(hits uint64, kv ...string) string {
		t.Helper()
		var es []*commonpb.RateLimitDescriptor_Entry
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, not a threshold
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "ai", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: es, HitsAddend: wrapperspb.UInt64(hits)}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit(%v, hits %d): %v", kv, hits, err)
		}
		return resp.OverallCode.String()
	}
	envoyAdmitted := 0
	for i := range abuseCalls {
		id := "r" + strconv.Itoa(i)
		if call(abuseEstimate, "tenant", "acme", "sluice_request_id", id) == "OK" {
			envoyAdmitted++
		}
		// Envoy ignores the stream-done call's answer; a settle is never denied.
		if got := call(abuseActual, "tenant", "acme", "sluice_request_id", id, "sluice_stream_done", "true"); got != "OK" {
			t.Errorf("stream-done call %d = %s, want OK", i, got)
		}
	}
	// An estimate above the rule's capacity is still a denial, now the
	// store's: it refuses the cost before it reads any state.
	if got := call(abuseLimit+1, "tenant", "other", "sluice_request_id", "big"); got != "OVER_LIMIT" {
		t.Errorf("an estimate of %d on a budget of %d = %s, want OVER_LIMIT", abuseLimit+1, abuseLimit, got)
	}
	// The same tenant's calls over the check API, on a policy of the
	// same numbers.
	checkAdmitted := 0
	for i := range abuseCalls {
		id := "e" + strconv.Itoa(i)
		if postCheck(t, s, fmt.Sprintf(`{"policy":"tokens","subject":"acme","op":"estimate","cost":%d,"evaluation_id":%q}`, abuseEstimate, id)) == http.StatusOK {
			checkAdmitted++
		}
		postCheck(t, s, fmt.Sprintf(`{"policy":"tokens","subject":"acme","op":"settle","cost":%d,"evaluation_id":%q}`, abuseActual, id))
	}
	// One estimate fits; its settle charges up to twice the limit counted
	// in the window (the debt bound), so every later estimate of the
	// hour is denied and its stream-done call has nothing to settle.
	if envoyAdmitted != 1 || checkAdmitted != 1 {
		t.Errorf("estimates admitted: Envoy %d, check API %d; want 1 each: the first call's settle leaves the tenant in debt", envoyAdmitted, checkAdmitted)
	}
	charged, owed := 2*abuseLimit-abuseEstimate, abuseLimit
	for series, want := range map[string]int{
		`sluice_settled_units_total{kind="charged",policy="ai.tenant"}`:         charged,
		`sluice_settled_units_total{kind="owed",policy="ai.tenant"}`:            owed,
		`sluice_settled_units_total{kind="given_back",policy="ai.tenant"}`:      0,
		`sluice_settled_units_total{kind="charged",policy="tokens"}`:            charged,
		`sluice_settled_units_total{kind="owed",policy="tokens"}`:               owed,
		`sluice_envoy_descriptors_total{code="settled",rule="ai.tenant"}`:       1,
		`sluice_envoy_descriptors_total{code="unsettled",rule="ai.tenant"}`:     abuseCalls - 1,
		`sluice_envoy_unsettled_total{reason="no_estimate",rule="ai.tenant"}`:   abuseCalls - 1,
		`sluice_envoy_descriptors_total{code="over_limit",rule="ai.tenant"}`:    abuseCalls,
		`sluice_decisions_total{outcome="incompatible",policy="ai.tenant"}`:     1,
		`sluice_decisions_total{outcome="allowed",policy="ai.tenant"}`:          1,
		`sluice_decisions_total{outcome="denied",policy="ai.tenant"}`:           abuseCalls - 1,
		`sluice_envoy_unsettled_total{reason="unavailable",rule="ai.tenant"}`:   0,
		`sluice_envoy_unsettled_total{reason="no_request_id",rule="ai.tenant"}`: 0,
	} {
		got := metricValue(t, s, series)
		if got == "" {
			got = "0"
		}
		if got != strconv.Itoa(want) {
			t.Errorf("%s = %q, want %d", series, got, want)
		}
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
	if strings.Contains(s.logs.String(), "acme") {
		t.Errorf("serve logs hold a raw descriptor value:\n%s", s.logs)
	}
}

// postCheck posts body to serve's check API and returns the status code.
func postCheck(t *testing.T, s *running, body string) int {
	t.Helper()
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatalf("POST /v1/check %s: %d, body: %v", body, resp.StatusCode, err)
	}
	return resp.StatusCode
}
