package server_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
)

// TestUIMarksEnvoyRules: the dashboard says what an Envoy rule's numbers
// mean. A shadow rule's denials were answered OK (Envoy got OK: the page
// must not read "denied 2" as enforced); a quota_mode rule stops a request
// only with every quota_mode descriptor over; a rule another replaces is
// not applied when both are; and week, month and year are envoyproxy/
// ratelimit's fixed 7, 30 and 365 days, not calendar periods.
func TestUIMarksEnvoyRules(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": envoyConfig(""), "rules/shop.yaml": `domain: shop
descriptors:
  - key: api
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: plan
    quota_mode: true
    rate_limit: { unit: month, requests_per_unit: 100 }
  - key: user
    rate_limit: { name: per_user, unit: week, requests_per_unit: 5 }
  - key: tier
    value: gold
    rate_limit: { unit: year, requests_per_unit: 50, replaces: [{ name: per_user }] }
`})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, not a threshold
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{
			{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "api", Value: "x"}}}}})
		cancel()
		if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("call %d of the shadow rule = %v, %v; want OK", i+1, resp, err)
		}
	}
	_, body, _ := get(t, s.url+"/ui/api/state", "")
	type policy struct {
		ID         string   `json:"id"`
		Window     string   `json:"window"`
		Shadow     bool     `json:"shadow"`
		QuotaMode  bool     `json:"quota_mode"`
		Replaces   []string `json:"replaces"`
		ReplacedBy []string `json:"replaced_by"`
	}
	var st struct {
		Policies []policy `json:"policies"`
		Live     []struct {
			Policy string           `json:"policy"`
			Total  map[string]int64 `json:"total"`
		} `json:"live"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/ui/api/state %s: %v", body, err)
	}
	want := []policy{
		{ID: "demo", Window: "1h0m0s"},
		{ID: "shop.api", Window: "1h0m0s", Shadow: true},
		{ID: "shop.plan", Window: "month (30 days, fixed)", QuotaMode: true},
		{ID: "shop.user", Window: "week (7 days, fixed)", ReplacedBy: []string{"shop.tier_gold"}},
		{ID: "shop.tier_gold", Window: "year (365 days, fixed)", Replaces: []string{"shop.user"}},
	}
	if diff := cmp.Diff(want, st.Policies); diff != "" {
		t.Errorf("/ui/api/state policies diff (-want +got):\n%s", diff)
	}
	for _, l := range st.Live {
		if l.Policy == "shop.api" && l.Total["denied"] != 2 {
			t.Errorf("live shop.api = %v, want 2 denied (counted, answered OK)", l.Total)
		}
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
}
