package simulate

import (
	"fmt"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// OverBound returns the interval in which admitted (µs, ascending, one
// unit each) holds most over what the algorithm kind with p can ever
// admit, or "" when none holds more, its times in seconds after origin.
// It trusts nothing but the times (the check of local quota's
// simulations and tests):
//
//   - token_bucket and gcra: any closed span [a, b] holds at most Burst +
//     (b − a) × Limit / Window units;
//   - fixed_window align=clock: every window of the clock at most Limit;
//   - fixed_window: every window at most Limit, where the first admission
//     opens a window and the first admission at or after a window's end
//     opens the next (the engine's rule).
func OverBound(kind algorithm.Kind, p algorithm.Params, admitted []int64, origin int64) string {
	if len(admitted) == 0 {
		return ""
	}
	w := p.Window
	if kind == algorithm.KindTokenBucket || kind == algorithm.KindGCRA {
		// n units in [a, b] break the bound iff (n − Burst)·W > (b − a)·L.
		// With C(j) the units up to and including j, the units of [t_i,
		// t_j] are C(j) − C(i−1), so the worst start for j is the least
		// C(i−1)·W − t_i·L over i ≤ j: one pass. Times count from the
		// first admission, so the products stay well inside int64.
		t0 := admitted[0]
		best, at := int64(0), 0
		worst, from, to := p.Burst*w, -1, -1
		for j, t := range admitted {
			if v := int64(j)*w - (t-t0)*p.Limit; j == 0 || v < best {
				best, at = v, j
			}
			if v := int64(j+1)*w - (t-t0)*p.Limit - best; v > worst {
				worst, from, to = v, at, j
			}
		}
		if from < 0 {
			return ""
		}
		a, b := admitted[from], admitted[to]
		return spanError(a-origin, b-origin, int64(to-from+1), p.Burst+(b-a)*p.Limit/w)
	}
	var start, n, most, mostStart, mostEnd int64
	for i, t := range admitted {
		switch {
		case p.Aligned && (i == 0 || t/w != start/w):
			start, n = t/w*w, 0
		case !p.Aligned && (i == 0 || t >= start+w):
			start, n = t, 0
		}
		if n++; n > most {
			most, mostStart, mostEnd = n, start, t
		}
	}
	if most <= p.Limit {
		return ""
	}
	return spanError(mostStart-origin, mostEnd-origin, most, p.Limit)
}

// spanError says that n units were admitted in [from, to] (µs) against a
// bound.
func spanError(from, to, n, bound int64) string {
	return fmt.Sprintf("%d admitted in [%.6f s, %.6f s], bound %d", n, float64(from)/1e6, float64(to)/1e6, bound)
}
