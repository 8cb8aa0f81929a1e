package rls

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
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

// TestMostRestrictiveIsTheRoots holds mostRestrictive, which picks the
// first RateLimit item and the Retry-After of an answer across its
// checks, to the root's choice among the statuses of one check (an
// Outcome's Status among its Statuses): on memstore at a fake clock,
// checks of several policies whose statuses tie in every way the choice
// looks at (denied or not, remaining, reset, retry), each outcome's
// Status is what mostRestrictive picks from its Statuses, in either
// order.
func TestMostRestrictiveIsTheRoots(t *testing.T) {
	clock := sluicetest.NewClock()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	policies := []sluice.Policy{
		{ID: "hour10", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour},
		{ID: "day10", Algorithm: sluice.FixedWindow, Limit: 10, Window: 24 * time.Hour},
		{ID: "hour5", Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Hour},
		{ID: "gcra10", Algorithm: sluice.GCRA, Limit: 10, Window: time.Hour},
		{ID: "bucket10", Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Hour},
	}
	lim, err := sluice.New(ms, policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sets := [][]string{{"hour10", "day10"}, {"day10", "hour10"}, {"hour5", "hour10", "day10"}, {"gcra10", "bucket10", "hour10"}, {"bucket10", "day10", "hour5"}}
	checks := 0
	for step := range 12 {
		for i, ids := range sets {
			subject := "s" + strconv.Itoa(i)
			reversed := slices.Clone(ids)
			slices.Reverse(reversed)
			for _, order := range [][]string{ids, reversed} {
				o := lim.Check(t.Context(), sluice.Request{Policies: order, Subject: subject, Op: sluice.Peek})
				if o.Kind != sluice.Allowed && o.Kind != sluice.Denied {
					t.Fatalf("step %d: Check(%v) = %v: %v", step, order, o.Kind, o.Err)
				}
				checks++
				if got := mostRestrictive(o.Statuses); got != o.Status {
					t.Errorf("step %d: mostRestrictive(%+v) = %+v, want the root's %+v", step, o.Statuses, got, o.Status)
				}
			}
			lim.Check(t.Context(), sluice.Request{Policy: ids[step%len(ids)], Subject: subject})
		}
		clock.Advance(7 * time.Minute)
	}
	if checks == 0 {
		t.Fatal("no check compared")
	}
}
