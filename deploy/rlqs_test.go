package deploy_test

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	rlqpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3" // the matcher inputs' @type
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/internal/config"
)

// TestEnvoyRLQSFilter reads envoy.yaml's rate_limit_quota filter as Envoy
// would (protojson into go-control-plane's types, each typed_config
// unpacked, and the protos' own validation rules), and holds it to
// sluice.yaml: its domain is an envoy.rlqs domain, it asks the sluice
// cluster, and every bucket id it builds has a matcher (so none gets the
// unmatched answer, ALLOW_ALL). Before the first assignment and after
// one expires, each bucket is a small token bucket: never ALLOW_ALL,
// which no bound covers, and never the last assignment reused, which
// after a TTL 0 (a sluice instance shutting down) would keep a share
// the server has given to another Envoy.
func TestEnvoyRLQSFilter(t *testing.T) {
	cfg, err := config.Load("sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Envoy.RLQS == nil {
		t.Fatal("deploy/sluice.yaml has no envoy.rlqs section for envoy.yaml's rate_limit_quota filter")
	}
	fc := &rlqpb.RateLimitQuotaFilterConfig{}
	unpackFilter(t, "envoy.filters.http.rate_limit_quota", fc)
	if err := fc.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml's rate_limit_quota filter: %v", err)
	}
	if got := fc.GetRlqsServer().GetEnvoyGrpc().GetClusterName(); got != "sluice" {
		t.Errorf("rlqs_server cluster = %q, want sluice", got)
	}
	var actions []*anypb.Any
	for _, m := range fc.GetBucketMatchers().GetMatcherList().GetMatchers() {
		actions = append(actions, m.GetOnMatch().GetAction().GetTypedConfig())
	}
	if a := fc.GetBucketMatchers().GetOnNoMatch().GetAction().GetTypedConfig(); a != nil {
		actions = append(actions, a)
	}
	if len(actions) == 0 {
		t.Fatal("the rate_limit_quota filter has no bucket matchers")
	}
	for i, a := range actions {
		s := &rlqpb.RateLimitQuotaBucketSettings{}
		if err := a.UnmarshalTo(s); err != nil {
			t.Fatalf("bucket matcher %d: %v", i, err)
		}
		if err := s.ValidateAll(); err != nil {
			t.Errorf("bucket matcher %d: %v", i, err)
		}
		id := map[string]string{}
		for k, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			id[k] = v.GetStringValue()
			if v.GetCustomValue() != nil {
				id[k] = "any-value" // from the request: a matcher must take every value
			}
		}
		if _, ok := cfg.Envoy.RLQS.Match(fc.GetDomain(), id); !ok {
			t.Errorf("bucket matcher %d builds bucket ids with keys %v: no matcher of sluice.yaml's envoy.rlqs domain %q takes them", i, slices.Sorted(maps.Keys(id)), fc.GetDomain())
		}
		// Envoy builds no limiter for a token bucket here (docs/rlqs.md,
		// "Envoy's filter, as read"): a blanket rule only.
		if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typepb.RateLimitStrategy_ALLOW_ALL {
			t.Errorf("bucket matcher %d: no_assignment_behavior = %v, want blanket_rule ALLOW_ALL", i, s.GetNoAssignmentBehavior())
		}
		if s.GetExpiredAssignmentBehavior().GetExpiredAssignmentBehaviorTimeout().GetSeconds() < 1 {
			t.Errorf("bucket matcher %d: expired_assignment_behavior_timeout = %v, want it set: Envoy reads unset as 0", i, s.GetExpiredAssignmentBehavior().GetExpiredAssignmentBehaviorTimeout())
		}
		if tb := s.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetTokenBucket(); tb == nil || tb.GetMaxTokens() == 0 {
			t.Errorf("bucket matcher %d: expired_assignment_behavior = %v, want a fallback token bucket", i, s.GetExpiredAssignmentBehavior())
		}
	}
}

// unpackFilter finds the HTTP filter name in envoy.yaml's listeners and
// reads its typed_config into m as Envoy reads it: protojson, every
// nested @type resolved.
func unpackFilter(t *testing.T, name string, m proto.Message) {
	t.Helper()
	doc := yamlDocs(t, "envoy.yaml")[0]
	var typed any
	for _, l := range list(dig(doc, "static_resources", "listeners")) {
		for _, fcs := range list(dig(l, "filter_chains")) {
			for _, f := range list(dig(fcs, "filters")) {
				for _, hf := range list(dig(f, "typed_config", "http_filters")) {
					if dig(hf, "name") == name {
						typed = dig(hf, "typed_config")
					}
				}
			}
		}
	}
	if typed == nil {
		t.Fatalf("envoy.yaml has no %s HTTP filter", name)
	}
	js, err := json.Marshal(typed)
	if err != nil {
		t.Fatal(err)
	}
	var a anypb.Any
	if err := protojson.Unmarshal(js, &a); err != nil {
		t.Fatalf("envoy.yaml's %s: %v", name, err)
	}
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("envoy.yaml's %s: %v", name, err)
	}
}

// dig returns the value at keys in nested YAML mappings; nil when absent.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// list returns v as a YAML list; nil when it is not one.
func list(v any) []any {
	l, _ := v.([]any)
	return l
}
