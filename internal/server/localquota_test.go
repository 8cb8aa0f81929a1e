package server_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestServeLocalQuota: a hot subject of a local_quota policy is admitted
// from blocks, over the check API (the answers say "local") and over
// Envoy's service with envoy.local_quota, and /metrics counts both.
func TestServeLocalQuota(t *testing.T) {
	dir := t.TempDir()
	cfg := `server: { listen: "127.0.0.1:0" }
policies:
  - id: api
    algorithm: gcra
    limit: 100000
    window: 1s
    local_quota: true
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
  local_quota: true
`
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg, "rules/shop.yaml": "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: second, requests_per_unit: 100000 }\n"})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	local := 0
	for range 400 {
		resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"api","subject":"tenant-1"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("check = %d %s, want 200", resp.StatusCode, body)
		}
		if strings.Contains(string(body), `"local":true`) {
			local++
		}
	}
	if local == 0 {
		t.Fatal(`no answer of 400 said "local":true`)
	}
	c := envoyClient(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user", Value: "carol"}}}}}
	for range 400 {
		if resp, err := c.ShouldRateLimit(ctx, req); err != nil || resp.OverallCode.String() != "OK" {
			t.Fatalf("ShouldRateLimit = %v, %v; want OK", resp, err)
		}
	}
	if n, _ := strconv.Atoi(metricValue(t, s, `sluice_local_quota_decisions_total{policy="api"}`)); n != local {
		t.Errorf(`sluice_local_quota_decisions_total{policy="api"} = %d, want %d, the answers that said local`, n, local)
	}
	var envoy int
	for _, line := range strings.Split(scrapeText(t, s.url), "\n") {
		if v, ok := strings.CutPrefix(line, "sluice_local_quota_decisions_total{policy=\"shop"); ok {
			envoy, _ = strconv.Atoi(v[strings.LastIndexByte(v, ' ')+1:])
		}
	}
	if envoy == 0 {
		t.Errorf("no Envoy decision was admitted from a block:\n%s", scrapeText(t, s.url))
	}
	t.Logf("check API: %d of 400 local; Envoy: %d of 400", local, envoy)
}
