package rls

import (
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
