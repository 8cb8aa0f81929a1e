package simulate

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// The table of ACCURACY.md's local-quota section, run once per test
// binary at sluice simulate --local-quota's defaults but for the limit,
// lqTestLimit (the defaults' own without -race): it is the slowest thing
// these tests do.
var defaultLQ struct {
	once    sync.Once
	results []*lqResult
	err     error
}

func defaultLQTable(t *testing.T) []*lqResult {
	t.Helper()
	defaultLQ.once.Do(func() {
		defaultLQ.results, defaultLQ.err = lqModel{instances: 4, seed: 1}.table(lqPolicies(lqTestLimit, 10*time.Second, 0), func(name string) PatternSpec {
			return PatternSpec{Name: name, Seed: 1}
		})
	})
	if defaultLQ.err != nil {
		t.Fatal(defaultLQ.err)
	}
	return defaultLQ.results
}

// TestSimulateLocalQuotaBound: on every pattern, four Limiters with local
// quota never admit more than the algorithm's bound, checked from the
// admission times alone, nor does the one exact Limiter (a check of the
// check); the exact Limiter admits what the engine-only simulation admits;
// blocks are taken; and the unused units are counted as the hook says.
func TestSimulateLocalQuotaBound(t *testing.T) {
	results := defaultLQTable(t)
	if want := len(LocalQuotaPatterns) * 6; len(results) != want {
		t.Fatalf("%d rows, want %d (patterns × 6 policies)", len(results), want)
	}
	engine := map[string]*Result{}
	for _, r := range results {
		name := r.pattern + " / " + lqName(r.policy)
		if r.overExact != "" {
			t.Errorf("%s: the exact Limiter broke the bound, %s: the check is wrong", name, r.overExact)
		}
		if r.over != "" {
			t.Errorf("%s: with local quota, %s", name, r.over)
		}
		if most, bound := maxInWindow(r.local, r.policy.Window), windowBound(r.policy); int64(most) > bound {
			t.Errorf("%s: %d admitted in one window's length with local quota, bound %d", name, most, bound)
		}
		// A subject takes blocks once it asked enough in three block
		// times in a row: the patterns that keep traffic up that long, at
		// the doc's limit (at lqTestLimit's 1000 under -race, a bucket of
		// burst 20 asks too little for a block).
		if sustained := r.pattern != Boundary && r.pattern != SlidingWorst; sustained && lqTestLimit == lqLimit && (r.stats.Blocks == 0 || r.stats.Local == 0) {
			t.Errorf("%s: local quota did %+v: no block was taken", name, r.stats)
		}
		if u := r.unused(); u < r.stats.Unused || r.stats.Unused < 0 {
			t.Errorf("%s: %d units unused counting those in hand, the unused units (localquota.Stats.Unused) %d: want 0 ≤ Unused ≤ that", name, u, r.stats.Unused)
		}
		if r.calls > int64(r.offered) || r.stats.Blocks > 0 && r.calls >= int64(r.offered) {
			t.Errorf("%s: %d store calls for %d decisions, %d blocks: local quota saved none", name, r.calls, r.offered, r.stats.Blocks)
		}
		res := engine[r.pattern]
		if res == nil {
			arrivals, start, end, err := Generate(PatternSpec{Name: r.pattern, Seed: 1}, lqTestLimit, (10 * time.Second).Microseconds())
			if err != nil {
				t.Fatal(err)
			}
			var ps []Policy
			for _, p := range lqPolicies(lqTestLimit, 10*time.Second, 0) {
				p = evaluation.Defaults(p)
				kind := algorithm.KindFixedWindow
				switch p.Algorithm {
				case sluice.TokenBucket:
					kind = algorithm.KindTokenBucket
				case sluice.GCRA:
					kind = algorithm.KindGCRA
				}
				ps = append(ps, Policy{Name: lqName(p), Kind: kind, Params: algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst, Aligned: p.ClockAligned}})
			}
			if res, err = Run(Spec{Start: start, End: end, Arrivals: arrivals, Policies: ps}); err != nil {
				t.Fatal(err)
			}
			engine[r.pattern] = res
		}
		for _, pr := range res.Results {
			if pr.Policy.Name != lqName(r.policy) {
				continue
			}
			var want []int64
			for i, ok := range pr.Admitted {
				if ok {
					want = append(want, res.Spec.Arrivals[i])
				}
			}
			if !slices.Equal(r.exact, want) {
				t.Errorf("%s: the exact Limiter admitted %d, the engine alone %d on the same arrivals: the model is not the engine", name, len(r.exact), len(want))
			}
		}
	}
}

// heldStore is a real store whose blocks are dated wrong, as a store
// that ignores Evaluation.Hold or a Limiter that keeps a block past its
// window would date them: the bound check must see it.
type heldStore struct {
	sluice.Store
	// undated drops the hold of a bucket's block: its units are spent
	// when it is taken, not as the hold requires.
	undated bool
	// outlive makes a fixed window's block seem to have its whole block
	// time before the window ends, so it is admitted from past the end of
	// the window that counted it.
	outlive time.Duration
}

func (s *heldStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	held := ev.Hold > 0
	if s.undated {
		ev.Hold = 0
	}
	err := s.Store.Evaluate(ctx, ev)
	if held && s.outlive > 0 && err == nil && len(ev.Statuses) == 1 {
		ev.Statuses[0].ResetAfter += s.outlive
	}
	return err
}

// TestSimulateLocalQuotaMisdated: blocks dated wrong break the bound on the
// patterns where they can, and the model says so, so the bound check of
// TestSimulateLocalQuotaBound can fail.
func TestSimulateLocalQuotaMisdated(t *testing.T) {
	policies := lqPolicies(lqLimit, 10*time.Second, 0)
	// A fixed window's blocks of a second carry enough past the window's
	// end, when the lull ends it and the flood fills the next, to show
	// above the units local quota leaves unused.
	long := func(p sluice.Policy) sluice.Policy {
		p.LocalQuota.BlockTime = time.Second
		return p
	}
	for _, c := range []struct {
		pattern string
		policy  sluice.Policy
		store   heldStore
	}{
		{Step, policies[4], heldStore{undated: true}},
		{Step, policies[5], heldStore{undated: true}},
		{Step, long(policies[0]), heldStore{outlive: time.Second}},
		{Step, long(policies[1]), heldStore{outlive: time.Second}},
	} {
		arrivals, _, _, err := Generate(PatternSpec{Name: c.pattern, Seed: 1}, lqLimit, (10 * time.Second).Microseconds())
		if err != nil {
			t.Fatal(err)
		}
		m := lqModel{instances: 4, seed: 1, wrap: func(s sluice.Store) sluice.Store {
			h := c.store
			h.Store = s
			return &h
		}}
		r, err := m.run(c.pattern, c.policy, arrivals)
		if err != nil {
			t.Fatal(err)
		}
		if r.over == "" {
			t.Errorf("%s / %s with blocks dated wrong (%+v): every interval within the bound; want one over it", c.pattern, lqName(r.policy), c.store)
		} else {
			t.Logf("%s / %s with blocks dated wrong: %s", c.pattern, lqName(r.policy), r.over)
		}
		if r.overExact != "" {
			t.Errorf("%s / %s: the exact Limiter, which takes no block, broke the bound: %s", c.pattern, lqName(r.policy), r.overExact)
		}
		if c.policy.Algorithm != sluice.FixedWindow {
			continue // the table's own rows are the buckets' control
		}
		if r, err = (lqModel{instances: 4, seed: 1}).run(c.pattern, c.policy, arrivals); err != nil {
			t.Fatal(err)
		} else if r.over != "" {
			t.Errorf("%s / %s, block time 1s, blocks dated right: %s; want every interval within the bound", c.pattern, lqName(r.policy), r.over)
		}
	}
}

// TestSimulateOverBound holds the bound check to each algorithm's rule on
// admissions made up to sit exactly at the bound, and one unit past it.
func TestSimulateOverBound(t *testing.T) {
	const origin = 1_000_000_000_000_000 // a window edge of 10s, and of 1s
	w := (10 * time.Second).Microseconds()
	bucket := sluice.Policy{Algorithm: sluice.GCRA, Limit: 10, Window: 10 * time.Second, Burst: 5}
	// A full bucket at once, then one a second: 5 + 1 per second.
	atBound := []int64{origin, origin, origin, origin, origin}
	for s := int64(1); s <= 20; s++ {
		atBound = append(atBound, origin+s*1_000_000)
	}
	aligned := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second, ClockAligned: true}
	first := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second}
	for _, c := range []struct {
		name     string
		policy   sluice.Policy
		admitted []int64
		over     bool
	}{
		{"bucket at its bound", bucket, atBound, false},
		{"bucket, one early", bucket, slices.Insert(slices.Clone(atBound), 5, origin+999_999), true},
		{"bucket, one more at once", bucket, slices.Insert(slices.Clone(atBound), 0, origin), true},
		{"bucket, the refill a µs late", bucket, append(slices.Clone(atBound[:5]), origin+1_000_001), false},
		{"aligned, full windows back to back", aligned, []int64{origin + w - 3, origin + w - 2, origin + w - 1, origin + w, origin + w, origin + w}, false},
		{"aligned, a fourth before the edge", aligned, []int64{origin + w - 4, origin + w - 3, origin + w - 2, origin + w - 1}, true},
		{"first-request, full windows back to back", first, []int64{origin + 5, origin + 6, origin + 7, origin + w + 5, origin + w + 5, origin + w + 6}, false},
		{"first-request, a fourth a µs before the window ends", first, []int64{origin + 5, origin + 6, origin + 7, origin + w + 4}, true},
		{"first-request, its window opened late by a lull", first, []int64{origin + 5, origin + 3*w, origin + 3*w + 1, origin + 3*w + 2, origin + 4*w - 1}, true},
	} {
		got := overBound(c.policy, c.admitted, origin)
		if (got != "") != c.over {
			t.Errorf("%s: overBound = %q, want over the bound: %v", c.name, got, c.over)
		}
	}
	if got, want := maxInWindow([]int64{origin, origin + w - 1, origin + w, origin + 2*w}, 10*time.Second), 2; got != want {
		t.Errorf("maxInWindow = %d, want %d: the interval (t − window, t] is half open", got, want)
	}
}

// TestAccuracyDocLocalQuota: ACCURACY.md holds the table sluice simulate
// --local-quota prints.
//
// The doc's table is at LocalQuotaLimit: not under -race (lqTestLimit
// says why); make test runs this test without it.
func TestAccuracyDocLocalQuota(t *testing.T) {
	if raceEnabled {
		t.Skip("the doc's table takes minutes under -race: make test runs this test without it (make unit-norace)")
	}
	doc, err := os.ReadFile("../../ACCURACY.md")
	if err != nil {
		t.Fatal(err)
	}
	if table := lqTable(defaultLQTable(t)); !strings.Contains(string(doc), table) {
		t.Errorf("ACCURACY.md does not hold the table simulate --local-quota prints:\n%s\nregenerate with: go run ./cmd/sluice simulate --local-quota, and paste its table into ACCURACY.md's local-quota section", table)
	}
}
