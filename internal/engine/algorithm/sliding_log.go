package algorithm

// SlidingLog is the state of an exact sliding-window log.
//
// Model: one timestamp is kept per admitted unit; a request of cost c is
// admitted when the units admitted in the last Params.Window µs (the
// half-open interval (now-Window, now]) plus c do not exceed Params.Limit.
//
// Burst: none beyond the limit; every interval of Window µs holds at most
// Limit units. Accuracy: exact. State: one entry per admitted unit still in
// the window (Limit entries at most), so memory grows with the limit.
// Several units admitted in the same microsecond are separate entries.
//
// Decide and Refund read only the entries they need (the newest, a binary
// search for the cut, the one that frees room) and return the change as a
// LogEdit, so a store can keep the log where reading all of it costs (a
// Redis list).
type SlidingLog struct {
	Entries []int64 // admission times in µs, ascending, one per unit; nil = absent
}

// LogEdit is the change a decision makes to a sliding log: drop the Cut
// oldest entries (they left the window) and the Drop newest (refunded),
// then append Add entries at At.
type LogEdit struct {
	Cut, Drop, Add, At int64
	Newest             int64 // the newest entry after the edit; 0 = the log is empty
}

// Apply returns s changed by e. Appending may reuse s.Entries' spare
// capacity, so s must not be used afterwards.
func (s SlidingLog) Apply(e LogEdit) SlidingLog {
	s.Entries = s.Entries[e.Cut : int64(len(s.Entries))-e.Drop]
	for i := int64(0); i < e.Add; i++ {
		s.Entries = append(s.Entries, e.At)
	}
	if len(s.Entries) == 0 {
		return SlidingLog{Entries: s.Entries[:0]}
	}
	return s
}

// cut returns how many of the oldest entries left the window at now: the
// first entry after now-Window, by binary search (the log is sorted). The
// oldest entry is looked at first: while it is still in the window, as it
// mostly is, that one read answers (redisstore reads each entry from
// Redis).
func (s SlidingLog) cut(p Params, now int64) int64 {
	lo, hi := int64(0), int64(len(s.Entries))
	if hi == 0 || s.Entries[0] > now-p.Window {
		return 0
	}
	lo = 1
	for lo < hi {
		mid := (lo + hi) / 2
		if s.Entries[mid] <= now-p.Window {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Decide evaluates cost at now and returns the edit that spends it (empty
// on a denial or a peek) and the decision.
func (s SlidingLog) Decide(p Params, now, cost int64) (LogEdit, Decision) {
	n := int64(len(s.Entries))
	cut := s.cut(p, now)
	count := n - cut
	d := Decision{Limit: p.Limit}
	need := verdictCost(cost)
	if count+need > p.Limit {
		// The entry whose expiry frees enough room: the (count+need-Limit)-th oldest.
		d.Remaining = max(p.Limit-count, 0) // count > Limit after a limit was lowered
		d.RetryAfter = s.Entries[cut+count+need-p.Limit-1] + p.Window - now
		d.ResetAfter = s.Newest() + p.Window - now
		return LogEdit{Newest: s.Newest()}, d
	}
	e := LogEdit{Cut: cut}
	if count > 0 {
		e.Newest = s.Newest()
	}
	if cost > 0 {
		e.Add, e.At, e.Newest = cost, now, now
	}
	d.Allowed = true
	d.Remaining = p.Limit - count - cost
	if e.Newest != 0 {
		d.ResetAfter = e.Newest + p.Window - now
	}
	return e, d
}

// Refund removes up to n of the newest entries still in the window (the
// most recent admissions), and returns the edit and the peek after it,
// always Allowed: a refund cannot be denied.
func (s SlidingLog) Refund(p Params, now, n int64) (LogEdit, Decision) {
	cut := s.cut(p, now)
	count := int64(len(s.Entries)) - cut
	e := LogEdit{Cut: cut, Drop: min(n, count)}
	left := count - e.Drop
	d := Decision{Allowed: true, Limit: p.Limit, Remaining: max(p.Limit-left, 0)}
	if left > 0 {
		e.Newest = s.Entries[cut+left-1]
		d.ResetAfter = e.Newest + p.Window - now
	}
	return e, d
}

// Expires returns the instant from which s equals an absent state.
func (s SlidingLog) Expires(p Params) int64 {
	if len(s.Entries) == 0 {
		return 0
	}
	return s.Entries[len(s.Entries)-1] + p.Window
}

// Newest returns the time of the newest write to s: its newest entry.
func (s SlidingLog) Newest() int64 {
	if len(s.Entries) == 0 {
		return 0
	}
	return s.Entries[len(s.Entries)-1]
}
