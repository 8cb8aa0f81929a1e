package edge

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestLocalFallbackScaling: the local fallback holds LocalShare of each
// policy (limit and burst rounded down, at least 1; max cost capped at the
// new capacity); a share outside (0, 1] is an error of New.
func TestLocalFallbackScaling(t *testing.T) {
	clock := sluicetest.NewClock()
	store := func() *memstore.Store {
		st, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	l, err := sluice.New(store(), []sluice.Policy{
		{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
		{ID: "tiny", Algorithm: sluice.SlidingLog, Limit: 1, Window: time.Minute},
		{ID: "tb", Algorithm: sluice.TokenBucket, Limit: 100, Window: time.Second, Burst: 40, MaxCost: 30},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(l, Options{Fallback: store(), LocalShare: 0.25, Prefix: "httplimit"})
	if err != nil {
		t.Fatal(err)
	}
	type nums struct{ Limit, Burst, MaxCost int64 }
	got := map[string]nums{}
	for _, id := range c.fallback.Policies() {
		p, _ := c.fallback.Policy(id)
		got[id] = nums{p.Limit, p.Burst, p.MaxCost}
	}
	want := map[string]nums{"fw": {2, 2, 2}, "tiny": {1, 1, 1}, "tb": {25, 10, 10}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fallback policies diff (-want +got):\n%s", diff)
	}
	for _, share := range []float64{-1, 1.5, math.NaN()} {
		if _, err := New(l, Options{Fallback: store(), LocalShare: share, Prefix: "httplimit"}); err == nil || !strings.Contains(err.Error(), "httplimit: LocalShare = ") {
			t.Errorf("New(LocalShare %v) = %v, want an error naming LocalShare", share, err)
		}
	}
	if _, err := New(l, Options{LocalShare: 0.5}); err == nil || !strings.Contains(err.Error(), "Fallback is nil") {
		t.Errorf("New(LocalShare without Fallback) = %v, want an error", err)
	}
}
