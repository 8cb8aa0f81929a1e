package algorithm

import "fmt"

// FixedPeriod is the state of a fixed window counting per calendar
// period: a month, a day in Europe/Berlin, … (package period).
//
// Model: FixedWindow's, on windows the calendar draws: the window holding
// a time is the period of Params.Bounds holding it (each is as long as
// the calendar makes it: a day with a DST change 23 or 25 hours, a month
// 28 to 31 days), and ResetAfter runs to that period's end. The engine
// reads no calendar: the caller computes the bounds around its own clock
// (the period before the one holding it, that one and the next), and a
// decision whose time lies outside all three is refused (periodOutside)
// rather than counted in a period nobody computed. The state keeps its
// period's end, so a decision needs no bounds until that period is over.
// It is kept on either clock (on Redis time, its newest write is held to
// the clock rule as every other algorithm's is).
//
// Burst: as FixedWindow's, per period (2 × Limit − 1 around a boundary).
// Accuracy: exact per period. State: three integers.
type FixedPeriod struct {
	End   int64 // µs at which the current period ends; 0 = absent
	Count int64 // units admitted in the current period
	Last  int64 // µs of the newest write
}

// fixedPeriodOf reads a FixedPeriod from the fields of a State.
func fixedPeriodOf(v *[5]int64) FixedPeriod {
	return FixedPeriod{End: v[0], Count: v[1], Last: v[2]}
}

// fields writes s as the fields of a State to v, one at a time.
func (s FixedPeriod) fields(v *[5]int64) {
	v[0], v[1], v[2], v[3], v[4] = s.End, s.Count, s.Last, 0, 0
}

// checkBounds reports, as a *RangeError, bounds that are no periods
// around a clock: four instants after the epoch and below 2^53, each
// period after the one before it and at most MaxPeriod long, and Window
// the middle period's length. params.lua's checkBounds ports it (the
// script holds the caller's bounds to it).
func (p Params) checkBounds() error {
	b := p.Bounds
	if b[0] < 1 || b[3] >= MaxExact {
		return &RangeError{"period", b[0], "bounds must lie after the epoch and below 2^53 µs"}
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] || b[i]-b[i-1] > MaxPeriod {
			return &RangeError{"period", b[i] - b[i-1], "each period must be 1µs to 367 days long, after the one before"}
		}
	}
	if p.Window != b[2]-b[1] {
		return &RangeError{"window", p.Window, "must be the length of the period holding the caller's clock"}
	}
	return nil
}

// corrupt returns why s is no state Decide or Refund leaves to keep, or
// "": a kept period holds a count of 1 to the limit at its write (one of
// 0 equals absent and is deleted), and its newest write lies in it, at
// most the longest period before its end: 0 < Last < End <= Last +
// MaxPeriod (the bounds of the widest policy: the period may have been
// another under one revision). redisstore's fixedPeriodCorrupt ports it.
func (s FixedPeriod) corrupt() string {
	switch {
	case s.Count < 1 || s.Count > MaxLimit:
		return fmt.Sprintf("count %d: want 1 to %d", s.Count, MaxLimit)
	case s.Last < 1 || s.End <= s.Last || s.End-s.Last > MaxPeriod:
		return fmt.Sprintf("end %d, last write %d: want 0 < last < end <= last + 367 days", s.End, s.Last)
	}
	return ""
}

// periodEnd returns the end of the period of p.Bounds holding t, or 0
// when t lies outside all of them.
func (p Params) periodEnd(t int64) int64 {
	b := &p.Bounds
	switch {
	case t < b[0] || t >= b[3]:
		return 0
	case t < b[1]:
		return b[1]
	case t < b[2]:
		return b[2]
	}
	return b[3]
}

// periodOutside returns a *ClockError when at, the time a policy of
// KindFixedPeriod is decided at, lies outside the periods of p.Bounds:
// the caller's clock, around which they were computed, is off by more
// than a period from the clock that decides (Redis's), or a state was
// written further ahead. Nothing is decided then: no period is known.
func (p Params) periodOutside(at int64) *ClockError {
	if p.periodEnd(at) == 0 {
		return &ClockError{At: at, From: p.Bounds[0], To: p.Bounds[3]}
	}
	return nil
}

// Decide evaluates cost at now and returns the new state and the
// decision: FixedWindow.Decide's, on the period holding now. now lies in
// p.Bounds (periodOutside refused it otherwise).
func (s FixedPeriod) Decide(p Params, now, cost int64) (FixedPeriod, Decision) {
	if s.Count == 0 || now >= s.End {
		s = FixedPeriod{End: p.periodEnd(now)}
	}
	d := Decision{Limit: p.Limit}
	ceiling := p.ceiling()
	if s.Count+verdictCost(cost) > ceiling {
		d.Remaining = max(ceiling-s.Count, 0) // Count > Limit after a limit was lowered
		d.ResetAfter = s.End - now
		d.RetryAfter = d.ResetAfter
		return s, d
	}
	if cost > 0 {
		s.Count, s.Last = s.Count+cost, now
	}
	d.Allowed = true
	d.Remaining = ceiling - s.Count
	if s.Count > 0 {
		d.ResetAfter = s.End - now
	}
	return s, d
}

// Expires returns the instant from which s equals an absent state: its
// period's end, while it holds a count.
func (s FixedPeriod) Expires() int64 {
	if s.Count == 0 {
		return 0
	}
	return s.End
}

// Refund gives back up to n units admitted in the current period (none
// once it has ended), as FixedWindow.Refund; the decision is the peek
// after it, always Allowed.
func (s FixedPeriod) Refund(p Params, now, n int64) (FixedPeriod, Decision) {
	if s.Count != 0 && now < s.End {
		s.Count, s.Last = max(s.Count-n, 0), now
	}
	if s.Expires() <= now {
		s = FixedPeriod{} // nothing left to remember: absent, as a store drops it
	}
	_, d := s.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	return s, d
}

// Newest returns the time of the newest write to s.
func (s FixedPeriod) Newest() int64 { return s.Last }

// stepPeriod is Policy.step for a FixedPeriod stored in st: the decision
// at now of cost (a refund when refund is set) goes to d, the state after
// it to v; it returns that state's expiry.
func stepPeriod(p Params, st *State, now int64, refund bool, cost int64, v *[5]int64, d *Decision) int64 {
	s := fixedPeriodOf(&st.V)
	if refund {
		s, *d = s.Refund(p, now, cost)
	} else {
		s, *d = s.Decide(p, now, cost)
	}
	s.fields(v)
	return s.Expires()
}
