package algorithm

import "fmt"

// FixedWindow is the state of a fixed-window counter.
//
// Model: the first admitted request opens a window of Params.Window µs;
// at most Params.Limit units are admitted until it closes, then the next
// admitted request opens a new one. Windows are anchored at their first
// admission, so one idle subject costs nothing; with Params.Aligned they
// are anchored at the clock instead: the window holding now starts at the
// largest multiple of Window since the Unix epoch not after now (the UTC
// second, minute, hour or day), as envoyproxy/ratelimit's windows do, and
// ResetAfter runs to the next such boundary.
//
// Burst: at most 2 × Limit − 1 units in any half-open interval of one
// window's length (Limit at the very end of one window, Limit − 1 more
// before the interval closes in the next; 2 × Limit in a closed interval
// of exactly one window). Accuracy: exact per window, not per sliding
// interval. State: three integers.
type FixedWindow struct {
	Start int64 // µs at which the current window opened; 0 = absent
	Count int64 // units admitted in the current window
	Last  int64 // µs of the newest write
}

// fixedWindowOf reads a FixedWindow from the fields of a State.
func fixedWindowOf(v *[5]int64) FixedWindow {
	return FixedWindow{Start: v[0], Count: v[1], Last: v[2]}
}

// fields writes s as the fields of a State to v, one at a time (a
// [5]int64 built and then copied whole is read back before its stores
// land, which stalls some CPUs).
func (s FixedWindow) fields(v *[5]int64) {
	v[0], v[1], v[2], v[3], v[4] = s.Start, s.Count, s.Last, 0, 0
}

// corrupt returns why s is no state Decide or Refund leaves to keep, or
// "": a kept window holds a count (one of 0 equals absent and is deleted)
// of at most the limit at its write, and its newest write lies in it:
// 0 < Start <= Last < Start + 365 days. The window and limit of that write may
// have been others than today's (numbers changed under one revision), so
// the bounds are the widest any policy has. redisstore's
// fixedWindowCorrupt ports it (memstore only reads what it wrote, and
// holds it so too).
func (s FixedWindow) corrupt() string {
	switch {
	case s.Count < 1 || s.Count > MaxLimit:
		return fmt.Sprintf("count %d: want 1 to %d", s.Count, MaxLimit)
	case s.Start < 1 || s.Last < s.Start || s.Last-s.Start >= MaxWindow:
		return fmt.Sprintf("start %d, last write %d: want 0 < start <= last < start + 365 days", s.Start, s.Last)
	}
	return ""
}

// windowStart returns the start of a window opened at now: now itself,
// or for an aligned window the boundary at or before now, at least 1µs
// (Start 0 means absent; only the epoch's first window is shortened, by 1µs).
func (p Params) windowStart(now int64) int64 {
	if !p.Aligned {
		return now
	}
	return max(floorDiv(now, p.Window)*p.Window, 1)
}

// Decide evaluates cost at now and returns the new state and the decision.
func (s FixedWindow) Decide(p Params, now, cost int64) (FixedWindow, Decision) {
	if s.Start == 0 || now >= s.Start+p.Window {
		s = FixedWindow{Start: p.windowStart(now)}
	}
	d := Decision{Limit: p.Limit}
	need, ceiling := verdictCost(cost), p.ceiling()
	if s.Count+need > ceiling {
		d.Remaining = max(ceiling-s.Count, 0) // Count > Limit after a limit was lowered
		d.ResetAfter = s.Start + p.Window - now
		d.RetryAfter = d.ResetAfter
		return s, d
	}
	if cost > 0 {
		s = FixedWindow{Start: s.Start, Count: s.Count + cost, Last: now}
	}
	d.Allowed = true
	d.Remaining = ceiling - s.Count
	if s.Count > 0 {
		d.ResetAfter = s.Start + p.Window - now
	}
	return s, d
}

// Expires returns the instant from which s equals an absent state.
func (s FixedWindow) Expires(p Params) int64 {
	if s.Count == 0 {
		return 0
	}
	return s.Start + p.Window
}

// Refund gives back up to n units admitted in the current window (none
// once it has closed: that window's budget is gone). The decision is the
// peek after it, always Allowed: a refund cannot be denied.
func (s FixedWindow) Refund(p Params, now, n int64) (FixedWindow, Decision) {
	if s.Start != 0 && now < s.Start+p.Window {
		s = FixedWindow{Start: s.Start, Count: max(s.Count-n, 0), Last: now}
	}
	if s.Expires(p) <= now {
		s = FixedWindow{} // nothing left to remember: absent, as a store drops it
	}
	_, d := s.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	return s, d
}

// Newest returns the time of the newest write to s.
func (s FixedWindow) Newest() int64 { return s.Last }

// FixedWindowEnd is a fixed window's state where the store's own clock
// decides and expires it (redisstore on Redis time, the default): the
// count and the window's end, nothing else. It decides as FixedWindow
// does, request for request; it keeps no newest write, since one clock
// both decides and expires the key (at End, rounded up to the next
// millisecond, with no grace: nothing reads a window once it has ended;
// the spend that opens a window sets that expiry, and a spend in a
// window that goes on keeps it), and a clock-aligned window ends at its
// boundary. A denial changes nothing. The caller's clock
// keeps FixedWindow, whose newest write bounds how far that clock may
// step back. State: two integers.
type FixedWindowEnd struct {
	End   int64 // µs at which the current window closes; 0 = absent
	Count int64 // units admitted in the current window
}

// fixedWindowEndOf reads a FixedWindowEnd from the fields of a State.
func fixedWindowEndOf(v *[5]int64) FixedWindowEnd {
	return FixedWindowEnd{End: v[0], Count: v[1]}
}

// fields writes s as the fields of a State to v, one at a time.
func (s FixedWindowEnd) fields(v *[5]int64) {
	v[0], v[1], v[2], v[3], v[4] = s.End, s.Count, 0, 0, 0
}

// corrupt returns why s is no state Decide or Refund leaves to keep at
// now, or "": a kept window holds a count of 1 to the limit at its write
// (one of 0 equals absent and is deleted) and ends after the epoch and at
// most a window, 365 days at the longest, after the clock that wrote it. (The
// store's clock may step back, NTP or a failover to a replica behind:
// within that the window is only decided as live for longer, never early;
// further, its subject would be locked out for longer than any window.)
func (s FixedWindowEnd) corrupt(now int64) string {
	switch {
	case s.Count < 1 || s.Count > MaxLimit:
		return fmt.Sprintf("count %d: want 1 to %d", s.Count, MaxLimit)
	case s.End < 1:
		return fmt.Sprintf("end %d: want a time after the epoch", s.End)
	case s.End-now > MaxWindow:
		return fmt.Sprintf("end is %d µs after the time of this call: want at most 365 days", s.End-now)
	}
	return ""
}

// Decide evaluates cost at now and returns the new state and the
// decision: FixedWindow.Decide's, the window's end kept instead of its
// start.
func (s FixedWindowEnd) Decide(p Params, now, cost int64) (FixedWindowEnd, Decision) {
	if s.Count == 0 || now >= s.End {
		s = FixedWindowEnd{End: p.windowStart(now) + p.Window}
	}
	d := Decision{Limit: p.Limit}
	ceiling := p.ceiling()
	if s.Count+verdictCost(cost) > ceiling {
		d.Remaining = max(ceiling-s.Count, 0) // Count > Limit after a limit was lowered
		d.ResetAfter = s.End - now
		d.RetryAfter = d.ResetAfter
		return s, d
	}
	s.Count += cost
	d.Allowed = true
	d.Remaining = ceiling - s.Count
	if s.Count > 0 {
		d.ResetAfter = s.End - now
	}
	return s, d
}

// Expires returns the instant from which s equals an absent state: its
// end, while it holds a count.
func (s FixedWindowEnd) Expires() int64 {
	if s.Count == 0 {
		return 0
	}
	return s.End
}

// Refund gives back up to n units admitted in the current window (none
// once it has ended), as FixedWindow.Refund; the decision is the peek
// after it, always Allowed.
func (s FixedWindowEnd) Refund(p Params, now, n int64) (FixedWindowEnd, Decision) {
	if s.Count != 0 && now < s.End {
		s.Count = max(s.Count-n, 0)
	}
	if s.Expires() <= now {
		s = FixedWindowEnd{} // nothing left to remember: absent, as a store drops it
	}
	_, d := s.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	return s, d
}

// Newest returns 0: s keeps no newest write. The clock that decides is
// the one that expires it, so the clock rule has nothing to guard (a
// window found ending further ahead than it could is corrupt instead).
func (s FixedWindowEnd) Newest() int64 { return 0 }
