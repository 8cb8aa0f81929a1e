package algorithm

import "fmt"

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

// corrupt returns why s is no log Decide or Refund leaves to keep under p
// at now, as far as a decision reads it, or "". A write cuts what left the
// window at its time and appends at that time, so a kept log holds at
// most MaxSlidingLogLen entries, ascending, each >= 1 and within (newest
// − 365 days, newest]. A decision reads its newest entry and checks every
// other entry it reads against it; it reads the oldest and the one before
// the newest always (an older entry pushed after the newest, issue 32, is
// one of those two or lies before the oldest), and a log its newest entry
// says has ended at now, about to be dropped whole, whole: ascending.
// Within a live log a disorder between entries read goes unseen, and
// harms nothing: an entry counted or cut wrongly is cut by the next write
// with the rest. redisstore's slidingLogCorrupt ports it.
func (s SlidingLog) corrupt(p Params, now int64) string {
	n := len(s.Entries)
	if n == 0 {
		return ""
	}
	if int64(n) > MaxSlidingLogLen {
		return fmt.Sprintf("holds %d entries: want at most %d", n, MaxSlidingLogLen)
	}
	newest := s.Entries[n-1]
	if newest < 1 {
		return fmt.Sprintf("entry %d = %d: want an integer > 0", n-1, newest)
	}
	in := func(i int) string {
		if v := s.Entries[i]; v < 1 || v > newest || v <= newest-MaxWindow {
			return fmt.Sprintf("entry %d = %d: want one in (newest - 365 days, newest], newest %d", i, v, newest)
		}
		return ""
	}
	if n >= 2 {
		if why := in(0); why != "" {
			return why
		}
		if why := in(n - 2); why != "" {
			return why
		}
	}
	if newest+p.Window <= now {
		for i := 1; i < n; i++ {
			if s.Entries[i] < s.Entries[i-1] {
				return fmt.Sprintf("entries are not ascending: entry %d = %d lies before entry %d = %d", i, s.Entries[i], i-1, s.Entries[i-1])
			}
		}
	}
	return ""
}

// Newest returns the time of the newest write to s: its newest entry.
func (s SlidingLog) Newest() int64 {
	if len(s.Entries) == 0 {
		return 0
	}
	return s.Entries[len(s.Entries)-1]
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
	need, ceiling := verdictCost(cost), p.ceiling()
	if count+need > ceiling {
		// The entry whose expiry frees enough room: the (count+need-ceiling)-th oldest.
		d.Remaining = max(ceiling-count, 0) // count > Limit after a limit was lowered
		d.RetryAfter = s.Entries[cut+count+need-ceiling-1] + p.Window - now
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
	d.Remaining = ceiling - count - cost
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
