package config_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice/internal/config"
)

// invalidRLQS maps each fixture of envoy.rlqs and of the overrides naming
// an RLQS bucket under testdata/invalid to the exact error Parse must
// return for it (TestParseInvalid runs them with the invalid table).
var invalidRLQS = []struct {
	file string
	want string
}{
	{"envoy_without_configs_or_rlqs.yaml", "envoy.configs: is required unless envoy.rlqs is set: at least one rules file pattern for the rate-limit service, or an rlqs: section for the quota service (line 6)"},
	{"rlqs_round_too_short.yaml", `envoy.rlqs.round: "50ms": must be between 100ms and 10s (line 9)`},
	{"rlqs_max_buckets_per_domain_zero.yaml", "envoy.rlqs.max_buckets_per_domain: 0: must be between 1 and 1000000 (line 9)"},
	{"rlqs_max_buckets_per_stream_too_big.yaml", "envoy.rlqs.max_buckets_per_stream: 2000000: must be between 1 and 1000000 (line 9)"},
	{"rlqs_no_domains.yaml", "envoy.rlqs.domains: at least one domain is required (line 9)"},
	{"rlqs_empty_domain.yaml", `envoy.rlqs.domains[0].domain: "": must not be empty: the domain the rate_limit_quota filter names (line 10)`},
	{"rlqs_duplicate_domain.yaml", `envoy.rlqs.domains[1].domain: "edge": is already the domain of envoy.rlqs.domains[0] (line 14)`},
	{"rlqs_no_buckets.yaml", "envoy.rlqs.domains[0].buckets: at least one bucket matcher is required (line 11)"},
	{"rlqs_empty_match.yaml", `envoy.rlqs.domains[0].buckets[0].match: must name at least one key of the bucket id, such as {tenant: "*"} (line 12)`},
	{"rlqs_empty_match_value.yaml", `envoy.rlqs.domains[0].buckets[0].match.route: "": must not be empty: the value to equal, or "*" for any value (each its own bucket) (line 14)`},
	{"rlqs_match_value_not_string.yaml", "envoy.rlqs.domains[0].buckets[0].match.version: 2: must be a string, not an integer; quote it (line 12)"},
	{"rlqs_unknown_policy.yaml", `envoy.rlqs.domains[0].buckets[0].policy: "per-user": is not the id of any policy (line 13)`},
	{"rlqs_unknown_key.yaml", "envoy.rlqs.rounds: unknown key: must be one of round, max_buckets_per_domain, max_buckets_per_stream, domains (did you mean round?) (line 9)"},
	{"rlqs_missing_policy.yaml", "envoy.rlqs.domains[0].buckets[0].policy: is required (line 12)"},
	{"rlqs_wrong_algorithm.yaml", `envoy.rlqs.domains[0].buckets[0].policy: "per-tenant": is a fixed_window policy: Envoy enforces a token bucket, so an RLQS bucket's policy must be token_bucket or gcra (a rate and a burst) (line 13)`},
	{"rlqs_burst_below_rate.yaml", `envoy.rlqs.domains[0].buckets[0].policy: "per-tenant": has burst 10 (the default: its limit), below the 100 tokens per second it refills (10 per 100ms): a token bucket holding less than a second of its rate loses its refill whenever requests pause; set burst to at least 100 (line 13)`},
	{"rlqs_every_mistake.yaml", strings.Join([]string{
		`envoy.rlqs.round: "20s": must be between 100ms and 10s (line 13)`,
		`envoy.rlqs.max_buckets_per_stream: 0: must be between 1 and 1000000 (line 14)`,
		`envoy.rlqs.domains[0].buckets[0].match.route: "": must not be empty: the value to equal, or "*" for any value (each its own bucket) (line 18)`,
		`envoy.rlqs.domains[0].buckets[0].policy: "per-user": is not the id of any policy (line 19)`,
		`envoy.rlqs.domains[0].buckets[1].match: must name at least one key of the bucket id, such as {tenant: "*"} (line 20)`,
		`envoy.rlqs.domains[0].buckets[1].policy: "slow": is a sliding_log policy: Envoy enforces a token bucket, so an RLQS bucket's policy must be token_bucket or gcra (a rate and a burst) (line 21)`,
		`envoy.rlqs.domains[1].domain: "edge": is already the domain of envoy.rlqs.domains[0] (line 22)`,
		`envoy.rlqs.domains[1].buckets: at least one bucket matcher is required (line 23)`,
	}, "\n")},
	{"rlqs_override_unknown_domain.yaml", `overrides[0].rlqs.domain: "web": is not a domain of envoy.rlqs (line 15)`},
	{"rlqs_override_wildcard.yaml", `overrides[0].rlqs.bucket.tenant: "*": names no one bucket: a plan is for one bucket id, each value the one that bucket has (line 15)`},
	{"rlqs_override_key_set.yaml", `overrides[0].rlqs.bucket: has the keys [tenant]: no matcher of domain "edge" has that key set, so the plan would never apply (line 15)`},
	{"rlqs_override_no_match.yaml", `overrides[0].rlqs.bucket: no matcher of domain "edge" matches it (each value must equal the matcher's, or the matcher's be "*"), so the plan would never apply (line 15)`},
	{"rlqs_override_wrong_policy.yaml", `overrides[0].policy: "other": the bucket's matcher has policy "per-tenant"; leave policy out or name that one (line 15)`},
	{"rlqs_override_burst_below_rate.yaml", `overrides[0].burst: 100: is below the 500 tokens per second the plan refills (500 per 1s): a token bucket holding less than a second of its rate loses its refill whenever requests pause; set burst to at least 500 (line 17)`},
	{"rlqs_override_missing_bucket.yaml", "overrides[0].rlqs.bucket: is required (line 15)"},
	{"rlqs_override_without_rlqs.yaml", "overrides[0].rlqs: names a bucket of Envoy's quota service, and there is no envoy.rlqs section (line 10)"},
}

// TestParseRLQS: envoy.rlqs reaches the Config with its defaults filled
// in, an override naming an RLQS bucket keeps its parsed form (and is no
// check API override), and Match finds a bucket id's matcher as the
// service does: the same key set, each value equal or "*", first match.
func TestParseRLQS(t *testing.T) {
	c, err := config.Load(filepath.Join("testdata", "valid", "rlqs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := &config.RLQS{
		Round: 2 * time.Second, MaxBucketsPerDomain: 50000, MaxBucketsPerStream: config.DefaultRLQSMaxBucketsPerStream,
		Domains: []config.RLQSDomain{
			{Domain: "edge", Buckets: []config.RLQSBucket{
				{Match: map[string]string{"tenant": "*", "route": "api"}, Policy: "per-tenant"},
				{Match: map[string]string{"route": "*"}, Policy: "per-route"},
			}},
			{Domain: "internal", Buckets: []config.RLQSBucket{{Match: map[string]string{"service": "*"}, Policy: "per-route"}}},
		},
	}
	if diff := cmp.Diff(want, c.Envoy.RLQS); diff != "" {
		t.Errorf("envoy.rlqs (-want +got):\n%s", diff)
	}
	wantO := []config.Override{{RLQS: &config.RLQSBucketID{Domain: "edge", Bucket: map[string]string{"tenant": "acme", "route": "api"}}, Limit: 500, Burst: 1000, Note: "acme enterprise"}}
	if diff := cmp.Diff(wantO, c.Overrides); diff != "" {
		t.Errorf("overrides (-want +got):\n%s", diff)
	}
	if got := c.SluiceOverrides(func(s string) string { return s }); len(got) != 0 {
		t.Errorf("SluiceOverrides = %+v, want none: an RLQS bucket is no check API subject", got)
	}
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("Warnings() = %v, want none", w)
	}
	for _, tc := range []struct {
		domain string
		id     map[string]string
		policy string // "": no match
	}{
		{"edge", map[string]string{"tenant": "acme", "route": "api"}, "per-tenant"},
		{"edge", map[string]string{"route": "api"}, "per-route"},
		{"edge", map[string]string{"tenant": "acme", "route": "web"}, ""},
		{"edge", map[string]string{"service": "billing"}, ""},
		{"internal", map[string]string{"service": "billing"}, "per-route"},
		{"other", map[string]string{"route": "api"}, ""},
	} {
		b, ok := c.Envoy.RLQS.Match(tc.domain, tc.id)
		if ok != (tc.policy != "") || b.Policy != tc.policy {
			t.Errorf("Match(%q, %v) = %+v, %v; want policy %q", tc.domain, tc.id, b, ok, tc.policy)
		}
	}
}

// TestParseRLQSOnly: envoy.rlqs alone (no rules files) is an Envoy
// section, with the defaults of round and both caps.
func TestParseRLQSOnly(t *testing.T) {
	c, err := config.Parse(strings.NewReader(`policies: [{id: p, algorithm: token_bucket, limit: 10, window: 1s}]
envoy:
  listen: 127.0.0.1:8081
  rlqs:
    domains: [{domain: edge, buckets: [{match: {tenant: "*"}, policy: p}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Envoy.RLQS
	if r.Round != config.DefaultRLQSRound || r.MaxBucketsPerDomain != config.DefaultRLQSMaxBucketsPerDomain || r.MaxBucketsPerStream != config.DefaultRLQSMaxBucketsPerStream {
		t.Errorf("envoy.rlqs = %+v, want the defaults 1s, 10000, 1000", r)
	}
	if config.DefaultRLQSRound != time.Second || config.DefaultRLQSMaxBucketsPerDomain != 10000 || config.DefaultRLQSMaxBucketsPerStream != 1000 {
		t.Errorf("defaults = %v, %d, %d; want 1s, 10000, 1000 (docs/configuration.md)", config.DefaultRLQSRound, config.DefaultRLQSMaxBucketsPerDomain, config.DefaultRLQSMaxBucketsPerStream)
	}
	if c, err := config.Parse(strings.NewReader("envoy: {listen: 127.0.0.1:8081, configs: [r.yaml]}\n")); err != nil || c.Envoy.RLQS != nil {
		t.Errorf("Parse(envoy without rlqs) = %+v, %v; want RLQS nil", c.Envoy, err)
	}
}

// TestRLQSWarnings: a matcher an earlier one shadows (the same key set,
// each earlier value equal or "*") loads, as a warning naming both lines.
func TestRLQSWarnings(t *testing.T) {
	c, err := config.Parse(strings.NewReader(`policies: [{id: p, algorithm: token_bucket, limit: 10, window: 1s, burst: 136}]
envoy:
  listen: 127.0.0.1:8081
  rlqs:
    domains:
      - domain: edge
        buckets:
          - {match: {tenant: "*", route: api}, policy: p}
          - {match: {tenant: acme, route: api}, policy: p}
          - {match: {tenant: acme, route: "*"}, policy: p}
          - {match: {route: api, tenant: "*"}, policy: p}
          - {match: {tenant: acme}, policy: p}
      - domain: other
        buckets:
          - {match: {tenant: "*"}, policy: p}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.Warnings() {
		got = append(got, w.Error())
	}
	want := []string{
		"envoy.rlqs.domains[0].buckets[1].match: can never match: buckets[0] above it (line 8) matches every bucket id this one does, and the first match wins (line 9)",
		"envoy.rlqs.domains[0].buckets[3].match: can never match: buckets[0] above it (line 8) matches every bucket id this one does, and the first match wins (line 11)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Warnings() (-want +got):\n%s", diff)
	}
}

// TestRLQSSmallPolicyWarnings: a matcher whose policy gives an idle or
// new Envoy's floor share, among a fleet of 16, less than one token of
// burst (b/(8·17) < 1, b < 136) or less than the least rate sluice sends
// (r/136 below one token in 1000 s, r < 0.136/s) loads, as a warning
// naming the matcher's line, the policy and the rule: that Envoy gets
// DENY_ALL until its demand earns it a share. Each matcher once.
func TestRLQSSmallPolicyWarnings(t *testing.T) {
	c, err := config.Parse(strings.NewReader(`policies:
  - {id: small, algorithm: token_bucket, limit: 100, window: 1s}
  - {id: enough, algorithm: token_bucket, limit: 100, window: 1s, burst: 136}
  - {id: slow, algorithm: gcra, limit: 200, window: 1h, burst: 200}
  - {id: both, algorithm: token_bucket, limit: 1, window: 10s}
envoy:
  listen: 127.0.0.1:8081
  rlqs:
    domains:
      - domain: edge
        buckets:
          - {match: {tenant: "*"}, policy: small}
          - {match: {route: "*"}, policy: enough}
          - {match: {user: "*"}, policy: slow}
          - {match: {ip: "*"}, policy: both}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.Warnings() {
		got = append(got, w.Error())
	}
	rule := "among 16 Envoys an idle or new one's floor share (1/136 of the policy) is too small for a token bucket, so it gets DENY_ALL until its demand earns it a share"
	want := []string{
		`envoy.rlqs.domains[0].buckets[0].policy: "small": has burst 100 (the default: its limit): ` + rule + `; set burst to at least 136 (line 12)`,
		`envoy.rlqs.domains[0].buckets[2].policy: "slow": refills 0.0556 tokens a second (200 per 1h0m0s): ` + rule + `; set a rate of at least 0.136 a second (line 14)`,
		`envoy.rlqs.domains[0].buckets[3].policy: "both": has burst 1 (the default: its limit) and refills 0.1 tokens a second (1 per 10s): ` + rule + `; set burst to at least 136 and a rate of at least 0.136 a second (line 15)`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Warnings() (-want +got):\n%s", diff)
	}
}

// TestParseRLQSOverridesNameNoValue: an RLQS override whose bucket is
// refused is reported by field and line, never with the bucket's values,
// which name a tenant.
func TestParseRLQSOverridesNameNoValue(t *testing.T) {
	_, err := config.Parse(strings.NewReader(`policies: [{id: p, algorithm: token_bucket, limit: 10, window: 1s}]
envoy:
  listen: 127.0.0.1:8081
  rlqs:
    domains: [{domain: edge, buckets: [{match: {tenant: "*", route: api}, policy: p}]}]
overrides:
  - {rlqs: {domain: edge, bucket: {tenant: tenant-secret-9, route: api}}, limit: 20}
  - {rlqs: {domain: edge, bucket: {route: api, tenant: tenant-secret-9}}, limit: 30}
  - {rlqs: {domain: edge, bucket: {tenant: tenant-secret-9, route: web}}, limit: 30}
  - {rlqs: {domain: edge, bucket: {tenant: "", route: api}}, limit: 30}
  - {rlqs: {domain: edge, bucket: {tenant: tenant-secret-9, route: api}}, subject: tenant-secret-9, limit: 30}
`))
	for _, w := range []string{
		`overrides[1].rlqs.bucket: is already overridden by overrides[0] (line 8)`,
		`overrides[2].rlqs.bucket: no matcher of domain "edge" matches it (each value must equal the matcher's, or the matcher's be "*"), so the plan would never apply (line 9)`,
		`overrides[3].rlqs.bucket.tenant: must not be empty: the value the bucket id has (line 10)`,
		`overrides[4]: names its subject twice: set one of subject, envoy, proxy and rlqs (line 11)`,
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Parse error lacks %q; it is:\n%v", w, err)
		}
	}
	if err != nil && strings.Contains(err.Error(), "tenant-secret-9") {
		t.Errorf("Parse error carries a bucket's value:\n%v", err)
	}
}
