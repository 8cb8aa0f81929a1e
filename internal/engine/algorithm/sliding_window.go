package algorithm

import "fmt"

// SlidingWindow is the state of a sliding-window counter (the weighted
// two-window estimate).
//
// Model: time is cut into windows aligned to multiples of Params.Window µs
// since the epoch. The count in the sliding interval ending now is estimated
// as Prev × (Window − elapsed) / Window + Curr, where elapsed is the time since
// the current window began; a request of cost c is admitted when that
// estimate plus c does not exceed Params.Limit. The comparison is done
// multiplied through by Window, so it is exact in integers.
//
// Burst: the estimate never exceeds the limit, but it assumes the previous
// window's requests were spread evenly, and the real count in a
// window-long interval can approach 2 × Limit: Limit crowded into the end
// of one window weighs almost nothing a little later, when most of Limit
// more is admitted. Example: 100 per 1s, 100 requests in the last 10ms of a
// window, then 97 more 970–980ms into the next: 197 admitted within 990ms.
// Poisson traffic that starts mid-window reaches about 1.5 × Limit.
// Accuracy: approximate; exact when the previous window's requests were
// spread evenly. Example: Prev 84, Curr 36, 25 % of the window elapsed →
// 84 × 0.75 + 36 = 99. State: four integers.
//
// SlidingWindow has no Refund: once a window rolls over, a unit spent in
// it is only a share of the estimate, so giving it back is not well
// defined.
type SlidingWindow struct {
	Start int64 // µs at which the current window began (a multiple of Window); 0 = absent
	Curr  int64 // units admitted in the current window
	Prev  int64 // units admitted in the window before it
	Last  int64 // µs of the newest write
}

// slidingWindowOf reads a SlidingWindow from the fields of a State.
func slidingWindowOf(v *[5]int64) SlidingWindow {
	return SlidingWindow{Start: v[0], Curr: v[1], Prev: v[2], Last: v[3]}
}

// fields writes s as the fields of a State to v, one at a time (a
// [5]int64 built and then copied whole is read back before its stores
// land, which stalls some CPUs).
func (s SlidingWindow) fields(v *[5]int64) {
	v[0], v[1], v[2], v[3], v[4] = s.Start, s.Curr, s.Prev, s.Last, 0
}

// corrupt returns why s is no state Decide writes, or "". It writes only
// an admitted spend, so Curr >= 1; both counts are at most the limit at a
// write; the newest write lies in the current window, Start <= Last <
// Start + window (Start is 0 only for a write before the first window
// ended). The window and limit of that write may have been others than
// today's, so the bounds are the widest any policy has.
func (s SlidingWindow) corrupt() string {
	switch {
	case s.Curr < 1 || s.Curr > MaxLimit || s.Prev > MaxLimit:
		return fmt.Sprintf("counts %d, %d: want 1 to %d in this window, at most that in the last", s.Curr, s.Prev, MaxLimit)
	case s.Last < 1 || s.Start < 0 || s.Last < s.Start || s.Last-s.Start >= MaxWindow:
		return fmt.Sprintf("start %d, last write %d: want start <= last < start + 365 days", s.Start, s.Last)
	}
	return ""
}

// advance moves s to the window that holds now.
func (s SlidingWindow) advance(p Params, now int64) SlidingWindow {
	w := now - now%p.Window
	switch {
	case w <= s.Start:
		return s
	case w == s.Start+p.Window:
		return SlidingWindow{Start: w, Prev: s.Curr, Last: s.Last}
	default:
		return SlidingWindow{Start: w, Last: s.Last}
	}
}

func (s SlidingWindow) resetAfter(p Params, elapsed int64) int64 {
	switch {
	case s.Curr > 0:
		return 2*p.Window - elapsed
	case s.Prev > 0:
		return p.Window - elapsed
	}
	return 0
}

// Decide evaluates cost at now and returns the new state and the decision.
// The returned state is always the stored state advanced to now; on a denial
// it holds the same counts, only re-based, and need not be written.
func (s SlidingWindow) Decide(p Params, now, cost int64) (SlidingWindow, Decision) {
	s = s.advance(p, now)
	elapsed := now - s.Start
	// All quantities below are scaled by Window.
	weighted := s.Prev*(p.Window-elapsed) + s.Curr*p.Window
	ceiling := p.ceiling()
	capacity := ceiling * p.Window // the class's: Limit's less its Reserve
	d := Decision{Limit: p.Limit}
	need := verdictCost(cost)
	if weighted+need*p.Window > capacity {
		d.Remaining = max(capacity-weighted, 0) / p.Window // above capacity after a limit was lowered
		d.ResetAfter = s.resetAfter(p, elapsed)
		if s.Curr+need <= ceiling {
			// Wait for the previous window's share to decay enough.
			at := p.Window - (ceiling-s.Curr-need)*p.Window/s.Prev
			d.RetryAfter = at - elapsed
		} else {
			// Wait for the next window, where Curr becomes Prev.
			at := p.Window - (ceiling-need)*p.Window/s.Curr
			d.RetryAfter = p.Window - elapsed + at
		}
		return s, d
	}
	if cost > 0 {
		s = SlidingWindow{Start: s.Start, Curr: s.Curr + cost, Prev: s.Prev, Last: now}
		weighted += cost * p.Window
	}
	d.Allowed = true
	d.Remaining = (capacity - weighted) / p.Window
	d.ResetAfter = s.resetAfter(p, elapsed)
	return s, d
}

// Expires returns the instant from which s equals an absent state.
func (s SlidingWindow) Expires(p Params) int64 {
	switch {
	case s.Curr > 0:
		return s.Start + 2*p.Window
	case s.Prev > 0:
		return s.Start + p.Window
	}
	return 0
}

// Newest returns the time of the newest write to s.
func (s SlidingWindow) Newest() int64 { return s.Last }
