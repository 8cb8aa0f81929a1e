package server_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestServeEnvoySettle: under sluice serve, Envoy's stream-done call
// settles the estimate its request-time call spent, and the settle is
// counted where every edge's is: sluice_settled_units_total under the
// rule's policy, and the dashboard's Settles table; a stream-done call
// without a request id is counted as unsettled.
func TestServeEnvoySettle(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": envoyConfig(""), "rules/ai.yaml": `domain: ai
descriptors:
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 1000, align: first_request, sluice_settle: true }
`})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	call := func(hits uint64, kv ...string) {
		t.Helper()
		var es []*commonpb.RateLimitDescriptor_Entry
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, not a threshold
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "ai", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: es, HitsAddend: wrapperspb.UInt64(hits)}}})
		if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit(%v, hits %d) = %v, %v; want OK", kv, hits, resp, err)
		}
	}
	call(300, "tenant", "acme", "sluice_request_id", "r1")                               // the estimate
	call(120, "tenant", "acme", "sluice_request_id", "r1", "sluice_stream_done", "true") // settled: 180 back
	call(120, "tenant", "acme", "sluice_request_id", "r1", "sluice_stream_done", "true") // retried: nothing
	call(500, "tenant", "acme", "sluice_request_id", "r2")                               // the estimate
	call(900, "tenant", "acme", "sluice_request_id", "r2", "sluice_stream_done", "true") // 400 charged, 220 owed
	call(7, "tenant", "acme", "sluice_stream_done", "true")                              // no request id
	for series, want := range map[string]string{
		`sluice_settled_units_total{kind="given_back",policy="ai.tenant"}`:      "180",
		`sluice_settled_units_total{kind="charged",policy="ai.tenant"}`:         "400",
		`sluice_settled_units_total{kind="owed",policy="ai.tenant"}`:            "20",
		`sluice_envoy_unsettled_total{reason="no_request_id",rule="ai.tenant"}`: "1",
		`sluice_envoy_descriptors_total{code="settled",rule="ai.tenant"}`:       "3",
	} {
		if got := metricValue(t, s, series); got != want {
			t.Errorf("%s = %q, want %q", series, got, want)
		}
	}
	_, body, _ := get(t, s.url+"/ui/api/state", "")
	if !strings.Contains(body, `{"policy":"ai.tenant","charged":400,"given_back":180,"owed":20}`) {
		t.Errorf("/ui/api/state = %s, want the Settles row of ai.tenant", body)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
	if strings.Contains(s.logs.String(), "acme") {
		t.Errorf("serve logs hold a raw descriptor value:\n%s", s.logs)
	}
}
