package rules

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestSettles: sluice_settle: true marks a rule of any algorithm that can
// give back; the rule is matched as any other.
func TestSettles(t *testing.T) {
	c, err := Parse([]Source{{Name: "s.yaml", Data: []byte(`domain: ai
descriptors:
  - key: api_key
    rate_limit: { unit: hour, requests_per_unit: 100000, sluice_settle: true }
  - key: model
    rate_limit: { unit: minute, requests_per_unit: 100, algorithm: token_bucket, sluice_settle: false }
`)}})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Match("ai", []Entry{{"api_key", "k"}})
	if r == nil || !r.Settles || r.Policy.Algorithm != sluice.FixedWindow || r.Policy.DedupeTTL != time.Hour || r.Policy.DedupeMax != 10000 {
		t.Fatalf("Match(api_key) = %+v, want a settling fixed_window rule remembering estimates an hour, 10 000 at once", r)
	}
	if r, _ := c.Match("ai", []Entry{{"model", "m"}}); r == nil || r.Settles {
		t.Fatalf("Match(model) = %+v, want a rule that does not settle", r)
	}
}
