// Package draw draws the random policies and clock steps with which the
// stores' short-course tests (memstore and redisstore short_test.go) hold
// their one short course to their general one.
package draw

import (
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// Policy draws a valid policy of algorithm a named id, with its defaults
// applied, of one of windows (a concurrency policy's LeaseTTL): limits
// from 1 to 100 000, a sheddable class now and then, a burst, a clock
// alignment, a most per request.
func Policy(r *rand.Rand, a sluice.Algorithm, id string, windows []time.Duration) *sluice.Policy {
	limits := []int64{1, 2, 3, 10, 1000, 100_000}
	for {
		p := sluice.Policy{ID: id, Algorithm: a, Limit: limits[r.IntN(len(limits))], Window: windows[r.IntN(len(windows))]}
		if r.IntN(3) == 0 {
			p.Priorities = map[string]int{"sheddable": 1 + r.IntN(100)}
		}
		if (a == sluice.TokenBucket || a == sluice.GCRA) && r.IntN(2) == 0 {
			p.Burst = 1 + r.Int64N(3*p.Limit)
		}
		p.ClockAligned = a == sluice.FixedWindow && r.IntN(2) == 0
		if a == sluice.Concurrency {
			p.Window, p.LeaseTTL = 0, p.Window
		} else if r.IntN(4) == 0 {
			p.MaxCost = 1 + r.Int64N(p.Limit)
		}
		if p.Validate() == nil {
			p = evaluation.Defaults(p)
			return &p
		}
	}
}

// Step draws a clock step for a window of w µs: none, small, within the
// window, beyond it, or backwards.
func Step(r *rand.Rand, w int64) int64 {
	switch r.IntN(8) {
	case 0:
		return 0
	case 1:
		return r.Int64N(1000)
	case 2, 3:
		return r.Int64N(w/4 + 1)
	case 4:
		return r.Int64N(w)
	case 5:
		return w + r.Int64N(2*w)
	case 6:
		return -r.Int64N(1000)
	default:
		return -r.Int64N(w)
	}
}
