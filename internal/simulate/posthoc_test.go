package simulate

import "testing"

// TestPostHocBounds: under the post-hoc pattern (estimates off by 0.25 to
// 3 times, a tenth of the callers crashing before they settle), what was
// really used in any window, less what the settles charged past their
// estimates, stays within each algorithm's own bound without settles:
// the limit for sliding_log, the bucket plus a window's refill for the
// buckets, two windows' limit for a fixed window (it admits up to
// 2 × limit − 1 across a boundary). And settles did charge: the pattern
// leaves the limit behind without them.
func TestPostHocBounds(t *testing.T) {
	const limit, window = 100, 10_000_000
	for _, seed := range []uint64{1, 2, 3} {
		arrivals, _, _, err := Generate(PatternSpec{Name: Poisson, Seed: seed}, limit, window)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range Compare(limit, window, 0) {
			bound := map[string]int64{"fixed_window": 2*limit - 1, "sliding_log": limit, "token_bucket": 2 * limit, "gcra": 2 * limit}[p.Name]
			if bound == 0 {
				continue // sliding_window: no estimates
			}
			r, err := RunPostHoc(p, arrivals, PostHoc{Seed: seed})
			if err != nil {
				t.Fatal(err)
			}
			if r.Excess > bound || r.Charged == 0 || r.Crashed == 0 || r.Settled == 0 {
				t.Errorf("seed %d %s: %+v: want used − charged at most %d in every window, some settles charging and some callers crashing", seed, p.Name, r, bound)
			}
		}
	}
}
