package rules

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPriorities: sluice_priorities gives a rule's policy its classes
// and shares, on a rate of any algorithm and on an in-flight limit, in
// percent with or without the sign, a share written through an alias;
// a rule without it has none.
func TestPriorities(t *testing.T) {
	c, err := Parse([]Source{{Name: "p.yaml", Data: []byte(`domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 100
      sluice_priorities: { critical: 100%, sheddable: 50% }
  - key: model
    rate_limit:
      unit: minute
      requests_per_unit: 60
      algorithm: gcra
      burst: 10
      sluice_priorities: { default: 80, batch: &half 30% }
  - key: user
    descriptors:
      - key: request_id
        rate_limit:
          sluice_in_flight: { limit: 10, lease_ttl: 5m }
          sluice_priorities: { sheddable: *half }
  - key: plain
    rate_limit: { unit: second, requests_per_unit: 5 }
`)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []Entry
		want    map[string]int
	}{
		{[]Entry{{"tenant", "t"}}, map[string]int{"critical": 100, "sheddable": 50}},
		{[]Entry{{"model", "m"}}, map[string]int{"default": 80, "batch": 30}},
		{[]Entry{{"user", "u"}, {"request_id", "r"}}, map[string]int{"sheddable": 30}},
		{[]Entry{{"plain", "p"}}, nil},
	} {
		r, _ := c.Match("api", tc.entries)
		if r == nil || !r.Decided() || !maps.Equal(r.Policy.Priorities, tc.want) {
			t.Errorf("Match(%v) = %+v, want a rule whose policy has priorities %v", tc.entries, r, tc.want)
		}
	}
}

// TestDocRules: every rules file docs/envoy.md shows (a yaml block that
// starts with domain:) loads.
func TestDocRules(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, block := range strings.Split(string(doc), "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if !strings.HasPrefix(block, "domain:") {
			continue
		}
		n++
		if _, err := Parse([]Source{{Name: "docs/envoy.md", Data: []byte(block)}}); err != nil {
			t.Errorf("a rules file of docs/envoy.md: %v\n%s", err, block)
		}
	}
	if n < 4 {
		t.Errorf("docs/envoy.md shows %d rules files, want at least 4 (its first example, in-flight, settle, priorities)", n)
	}
}
