package rls

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rules"
)

// TestOneHeadersAreHeaders holds oneHeaders to headers' general path:
// a request with one decided descriptor gets the header values the
// general path gives it once a repeat of that descriptor (deduplicated
// there, so the same values) sends it down that path.
func TestOneHeadersAreHeaders(t *testing.T) {
	policy := sluice.Policy{ID: "bench_user", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour}
	statuses := []sluice.Status{
		{Policy: "bench_user", Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 1500 * time.Millisecond},
		{Policy: "bench_user", Allowed: false, Limit: 10, Remaining: 0, ResetAfter: time.Hour, RetryAfter: 59 * time.Minute},
	}
	for _, shadow := range []bool{false, true} {
		for _, over := range []bool{false, true} {
			for i := range statuses {
				rule := &rules.Rule{Policy: policy, Shadow: shadow}
				rule.Derive()
				ds := []descriptor{{rule: &rules.Rule{}}, {rule: rule, decided: &statuses[i]}}
				got, ok := oneHeaders(ds, over, newReply(len(ds)))
				if !ok {
					t.Fatalf("oneHeaders declined one decided descriptor")
				}
				want := headers(append(ds, ds[1]), over, newReply(len(ds)+1))
				if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
					t.Errorf("shadow %v, over %v, status %d: (-headers +oneHeaders)\n%s", shadow, over, i, diff)
				}
				if len(got) < 2 {
					t.Errorf("shadow %v, over %v, status %d: %d header values, want RateLimit-Policy and RateLimit at least", shadow, over, i, len(got))
				}
			}
		}
	}
	if hs, ok := oneHeaders([]descriptor{{}}, true, newReply(1)); !ok || hs != nil {
		t.Errorf("oneHeaders(nothing decided) = %v, %v; want nil, true as headers", hs, ok)
	}
}

// TestHeadersLeadWithTheMostRestrictive: across the checks of one
// request the RateLimit field leads with the status the root's choice
// picks among them all (a shadow rule's too), and Retry-After is the
// longest wait of the enforced rules' denials only.
func TestHeadersLeadWithTheMostRestrictive(t *testing.T) {
	type decided struct {
		id     string
		shadow bool
		st     sluice.Status
	}
	for _, tc := range []struct {
		name      string
		ds        []decided
		first     string // the policy the RateLimit field names first
		retryWant string // "": none
	}{
		{"fewest left", []decided{
			{"a", false, sluice.Status{Allowed: true, Limit: 10, Remaining: 5, ResetAfter: time.Minute}},
			{"b", false, sluice.Status{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: time.Second}},
			{"c", false, sluice.Status{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: time.Second}},
		}, "b", ""},
		{"as few left: the later reset", []decided{
			{"a", false, sluice.Status{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: time.Second}},
			{"b", false, sluice.Status{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: time.Minute}},
		}, "b", ""},
		{"the longest denial, a shadow one's; Retry-After the enforced one's", []decided{
			{"a", false, sluice.Status{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: time.Hour}},
			{"b", false, sluice.Status{Allowed: false, Limit: 10, ResetAfter: time.Minute, RetryAfter: 30 * time.Second}},
			{"c", true, sluice.Status{Allowed: false, Limit: 10, ResetAfter: time.Hour, RetryAfter: time.Hour}},
			{"d", false, sluice.Status{Allowed: false, Limit: 10, ResetAfter: time.Minute, RetryAfter: 20 * time.Second}},
		}, "c", "30"},
	} {
		var ds []descriptor
		for _, d := range tc.ds {
			rule := &rules.Rule{Policy: sluice.Policy{ID: d.id, Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour}, Shadow: d.shadow}
			rule.Derive()
			st := d.st
			st.Policy = d.id
			ds = append(ds, descriptor{rule: rule, decided: &st})
		}
		hs := headers(ds, true, newReply(len(ds)))
		got := map[string]string{}
		for _, h := range hs {
			got[h.Key] = h.Value
		}
		if l := got["RateLimit"]; !strings.HasPrefix(l, strconv.Quote(tc.first)+";") {
			t.Errorf("%s: RateLimit = %q, want %q first", tc.name, l, tc.first)
		}
		if ra := got["Retry-After"]; ra != tc.retryWant {
			t.Errorf("%s: Retry-After = %q, want %q", tc.name, ra, tc.retryWant)
		}
	}
}
