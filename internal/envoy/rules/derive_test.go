package rules

import (
	"testing"

	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
)

// TestRulesLoadDerived: every rule loaded carries what a request reads
// of it (Rule.Derive) equal to what a request derived from it before:
// the metric label, the unit's length, the most one request can spend
// and the RateLimit-Policy member.
func TestRulesLoadDerived(t *testing.T) {
	cfg, err := Parse([]Source{{Name: "d.yaml", Data: []byte(`
domain: d
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: bucket
    rate_limit: { unit: hour, requests_per_unit: 10, algorithm: token_bucket, burst: 4 }
  - key: "odd key/with bytes"
    rate_limit: { unit: day, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
  - key: tenant
    descriptors:
      - key: request_id
        rate_limit: { sluice_in_flight: { limit: 3, lease_ttl: 1m } }
`)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cfg.Rules() {
		want := Rule{Label: PolicyID(r.Key), UnitLength: r.Unit.Duration()}
		if r.Decided() {
			want.MaxCost = evaluation.Defaults(r.Policy).MaxCost
			want.PolicyItem = string(ratelimitheader.AppendPolicyItem(nil, r.Policy))
		}
		if r.Label != want.Label || r.UnitLength != want.UnitLength || r.MaxCost != want.MaxCost || r.PolicyItem != want.PolicyItem {
			t.Errorf("rule %s: Label %q, UnitLength %v, MaxCost %d, PolicyItem %q; want %q, %v, %d, %q",
				r.Key, r.Label, r.UnitLength, r.MaxCost, r.PolicyItem, want.Label, want.UnitLength, want.MaxCost, want.PolicyItem)
		}
		if r.Decided() && (r.MaxCost == 0 || r.PolicyItem == "") {
			t.Errorf("rule %s, decided by the store: MaxCost %d, PolicyItem %q; want both set", r.Key, r.MaxCost, r.PolicyItem)
		}
	}
}
