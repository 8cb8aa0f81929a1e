package algorithm

import "slices"

// SlidingLog is the state of an exact sliding-window log.
//
// Model: one timestamp is kept per admitted unit; a request of cost c is
// admitted when the units admitted in the last Params.Window µs (the
// half-open interval (now-Window, now]) plus c do not exceed Params.Limit.
//
// Burst: none beyond the limit; every interval of Window µs holds at most
// Limit units. Accuracy: exact. State: one entry per admitted unit still in
// the window (Limit entries at most), so memory grows with the limit.
//
// Several units admitted in the same microsecond are separate entries. A
// clock that moves behind the newest entry is treated as that entry's time,
// which keeps Entries sorted.
type SlidingLog struct {
	Entries []int64 // admission times in µs, ascending, one per unit; nil = absent
}

// trim drops the entries that left the window at now: a binary search and a
// reslice, no copy (appends reallocate and compact when the capacity runs
// out), so a log under steady load costs O(log n) amortized per decision.
// The result is the same state: same decisions from now on.
func (s SlidingLog) trim(p Params, now int64) SlidingLog {
	cut, _ := slices.BinarySearch(s.Entries, now-p.Window+1)
	s.Entries = s.Entries[cut:]
	return s
}

// Decide evaluates cost at now and returns the new state and the decision.
// The returned state may share Entries' backing array with s; an admission
// appends past the end of s.Entries, so s stays valid and unchanged.
func (s SlidingLog) Decide(p Params, now, cost int64) (SlidingLog, Decision) {
	if n := len(s.Entries); n > 0 && now < s.Entries[n-1] {
		now = s.Entries[n-1]
	}
	s = s.trim(p, now)
	count := int64(len(s.Entries))
	d := Decision{Limit: p.Limit}
	need := verdictCost(cost)
	if count+need > p.Limit {
		// The entry whose expiry frees enough room: the (count+need-Limit)-th oldest.
		d.Remaining = max(p.Limit-count, 0) // count > Limit after a limit was lowered
		d.RetryAfter = s.Entries[count+need-p.Limit-1] + p.Window - now
		d.ResetAfter = s.Entries[count-1] + p.Window - now
		return s, d
	}
	for i := int64(0); i < cost; i++ {
		s.Entries = append(s.Entries, now)
	}
	d.Allowed = true
	d.Remaining = p.Limit - int64(len(s.Entries))
	if n := len(s.Entries); n > 0 {
		d.ResetAfter = s.Entries[n-1] + p.Window - now
	}
	return s, d
}

// Refund removes up to n of the newest entries still in the window (the
// most recent admissions). The decision is the peek after it, always
// Allowed: a refund cannot be denied.
func (s SlidingLog) Refund(p Params, now, n int64) (SlidingLog, Decision) {
	if k := len(s.Entries); k > 0 && now < s.Entries[k-1] {
		now = s.Entries[k-1]
	}
	s = s.trim(p, now)
	s.Entries = s.Entries[:int64(len(s.Entries))-min(n, int64(len(s.Entries)))]
	if len(s.Entries) == 0 {
		s = SlidingLog{} // absent, as a store drops it
	}
	_, d := s.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	return s, d
}

// Expires returns the instant from which s equals an absent state.
func (s SlidingLog) Expires(p Params) int64 {
	if len(s.Entries) == 0 {
		return 0
	}
	return s.Entries[len(s.Entries)-1] + p.Window
}
