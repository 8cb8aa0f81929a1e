package algorithm

// FixedWindow is the state of a fixed-window counter.
//
// Model: the first admitted request opens a window of Params.Window µs;
// at most Params.Limit units are admitted until it closes, then the next
// admitted request opens a new one. Windows are anchored at their first
// admission, not at wall-clock boundaries, so one idle subject costs nothing.
//
// Burst: up to 2 × Limit in a short interval around a window boundary
// (Limit at the end of one window, Limit at the start of the next). Accuracy:
// exact per window, not per sliding interval. State: two integers.
//
// A clock that moves behind Start is treated as Start: the window neither
// reopens nor stretches.
type FixedWindow struct {
	Start int64 // µs at which the current window opened; 0 = absent
	Count int64 // units admitted in the current window
}

// Decide evaluates cost at now and returns the new state and the decision.
func (s FixedWindow) Decide(p Params, now, cost int64) (FixedWindow, Decision) {
	if s.Start != 0 && now < s.Start {
		now = s.Start
	}
	if s.Start == 0 || now >= s.Start+p.Window {
		s = FixedWindow{Start: now}
	}
	d := Decision{Limit: p.Limit}
	need := verdictCost(cost)
	if s.Count+need > p.Limit {
		d.Remaining = max(p.Limit-s.Count, 0) // Count > Limit after a limit was lowered
		d.ResetAfter = s.Start + p.Window - now
		d.RetryAfter = d.ResetAfter
		return s, d
	}
	if cost > 0 {
		s.Count += cost
	}
	d.Allowed = true
	d.Remaining = p.Limit - s.Count
	if s.Count > 0 {
		d.ResetAfter = s.Start + p.Window - now
	}
	return s, d
}

// Refund gives back up to n units admitted in the current window (none
// once it has closed: that window's budget is gone). The decision is the
// peek after it, always Allowed: a refund cannot be denied.
func (s FixedWindow) Refund(p Params, now, n int64) (FixedWindow, Decision) {
	if s.Start != 0 && max(now, s.Start) < s.Start+p.Window {
		s.Count = max(s.Count-n, 0)
	}
	if s.Expires(p) <= now {
		s = FixedWindow{} // nothing left to remember: absent, as a store drops it
	}
	_, d := s.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	return s, d
}

// Expires returns the instant from which s equals an absent state.
func (s FixedWindow) Expires(p Params) int64 {
	if s.Count == 0 {
		return 0
	}
	return s.Start + p.Window
}
