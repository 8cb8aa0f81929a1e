package rules

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestLocalQuota: sluice_local_quota on a rule's rate_limit is its
// policy's local quota, spelled as the main config's local_quota: true
// for the defaults, a mapping of its numbers (which turns it on), or
// false; a rule that writes it has its own (OwnLocalQuota), one that does
// not leaves it to envoy.local_quota.
func TestLocalQuota(t *testing.T) {
	c, err := Parse([]Source{{Name: "q.yaml", Data: []byte(`domain: d
descriptors:
  - key: hot
    rate_limit: { unit: second, requests_per_unit: 1000, sluice_local_quota: true }
  - key: tuned
    rate_limit:
      unit: minute
      requests_per_unit: 60000
      algorithm: gcra
      sluice_local_quota: { block_time: 50ms, max_block: 200 }
  - key: off
    rate_limit: { unit: second, requests_per_unit: 1000, sluice_local_quota: false }
  - key: plain
    rate_limit: { unit: second, requests_per_unit: 1000 }
`)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want sluice.LocalQuota
		own  bool
	}{
		{"hot", sluice.LocalQuota{Enabled: true}, true},
		{"tuned", sluice.LocalQuota{Enabled: true, BlockTime: 50 * time.Millisecond, MaxBlock: 200}, true},
		{"off", sluice.LocalQuota{}, true},
		{"plain", sluice.LocalQuota{}, false},
	} {
		r, _ := c.Match("d", []Entry{{tc.key, "v"}})
		if r == nil || r.Policy.LocalQuota != tc.want || r.OwnLocalQuota != tc.own {
			t.Errorf("Match(%s) = %+v, want local quota %+v, own %v", tc.key, r, tc.want, tc.own)
		}
	}
}

// TestLocalQuotaEveryProblem: every problem of sluice_local_quota in a
// file is reported in one pass, each at its own key and line.
func TestLocalQuotaEveryProblem(t *testing.T) {
	_, err := Parse([]Source{{Name: "q.yaml", Data: []byte(`domain: d
descriptors:
  - key: a
    rate_limit: { unit: second, requests_per_unit: 1000, algorithm: sliding_window, sluice_local_quota: true }
  - key: b
    rate_limit: { unit: second, requests_per_unit: 1000, sluice_local_quota: { block_time: 10, max_block: 2 } }
  - key: c
    rate_limit: { unlimited: true, sluice_local_quota: false }
`)}})
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("Parse = %v, want Errors", err)
	}
	want := []string{
		"q.yaml: descriptors[0].rate_limit.sluice_local_quota: true: does not apply to sliding_window: its estimate weighs each unit by the window it was spent in, and a block's units would be used after the store counted them (line 4)",
		`q.yaml: descriptors[1].rate_limit.sluice_local_quota.block_time: 10: must be a duration such as 50ms (line 6)`,
		"q.yaml: descriptors[2].rate_limit.sluice_local_quota: false: must not be set when unlimited is true (line 8)",
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Error())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Parse errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
