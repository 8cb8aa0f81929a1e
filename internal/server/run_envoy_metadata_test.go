package server_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestServeEnvoyResponseMetadata: envoy.response_metadata reaches the
// service serve runs; quota_mode and metadata load from a rules file.
func TestServeEnvoyResponseMetadata(t *testing.T) {
	dir := t.TempDir()
	cfg := strings.Replace(envoyConfig(""), `configs: ["rules/*.yaml"]`, `configs: ["rules/*.yaml"]
  response_metadata: true`, 1)
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg, "rules/shop.yaml": `domain: shop
descriptors:
  - key: backend
    value: a
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
    metadata: { backend_with_quota: a }
`})
	c := envoyClient(t, startRun(t, filepath.Join(dir, "sluice.yaml"), ""))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{
		{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "backend", Value: "a"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["backend_with_quota"].GetStringValue(); got != "a" {
		t.Errorf("dynamic metadata = %v, want metadata.backend_with_quota a", resp.GetDynamicMetadata())
	}
}
