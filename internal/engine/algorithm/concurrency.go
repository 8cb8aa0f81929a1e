package algorithm

// Concurrency is the state of a concurrency limit: the leases held.
//
// Model: a lease is held from its acquisition until it is released or
// until its expiry, acquisition (or last renewal) + Params.Window µs (the
// policy's lease_ttl); an acquisition is admitted while fewer than
// Params.Limit leases are live (expiry after now). A lease holds one slot
// whatever the request's cost. A holder that dies without releasing gives
// its slot back when its lease expires, so a slot never leaks for longer
// than the lease TTL.
//
// Burst: none; at most Limit leases at any instant. Accuracy: exact.
// State: one (id, expiry) pair per lease held, Limit at most (a Redis
// sorted set scored by expiry).
//
// Decide, Renew and Release read only what they need (how many expired,
// one entry, the position of one lease) and return the change as a
// LeaseEdit, so a store can keep the leases where reading all of them
// costs (a Redis sorted set).
type Concurrency struct {
	Expiries []int64  // µs, ascending; nil = absent
	IDs      []string // IDs[i] is the lease that expires at Expiries[i]
}

// LeaseEdit is the change a decision makes to a Concurrency: drop the Cut
// soonest-expiring leases (they expired), drop the lease Remove (a
// release; "" none), then hold the lease Add until At ("" none; a lease
// already held is moved to At).
type LeaseEdit struct {
	Cut    int64
	Remove string
	Add    string
	At     int64
	Newest int64 // the latest expiry after the edit; 0 = no lease left
}

// Apply returns s changed by e. It may reuse s's arrays, so s must not be
// used afterwards.
func (s Concurrency) Apply(e LeaseEdit) Concurrency {
	s.Expiries, s.IDs = s.Expiries[e.Cut:], s.IDs[e.Cut:]
	for _, id := range [2]string{e.Remove, e.Add} {
		if id == "" {
			continue
		}
		if i := s.find(id); i >= 0 {
			s.Expiries = append(s.Expiries[:i], s.Expiries[i+1:]...)
			s.IDs = append(s.IDs[:i], s.IDs[i+1:]...)
		}
	}
	if e.Add != "" {
		// After every expiry held, unless lease_ttl was lowered without a
		// new revision: insert in order all the same.
		i := len(s.Expiries)
		for i > 0 && s.Expiries[i-1] > e.At {
			i--
		}
		s.Expiries = append(s.Expiries, 0)
		copy(s.Expiries[i+1:], s.Expiries[i:])
		s.Expiries[i] = e.At
		s.IDs = append(s.IDs, "")
		copy(s.IDs[i+1:], s.IDs[i:])
		s.IDs[i] = e.Add
	}
	if len(s.Expiries) == 0 {
		return Concurrency{Expiries: s.Expiries[:0], IDs: s.IDs[:0]}
	}
	return s
}

// Newest returns the latest expiry of s, 0 when it holds no lease. The
// newest write to s is then Newest − Params.Window: a lease is written
// at its acquisition or renewal.
func (s Concurrency) Newest() int64 {
	if len(s.Expiries) == 0 {
		return 0
	}
	return s.Expiries[len(s.Expiries)-1]
}

// find returns the index of lease id in s, or -1. (The Lua port asks
// ZRANK.)
func (s Concurrency) find(id string) int64 {
	for i, x := range s.IDs {
		if x == id {
			return int64(i)
		}
	}
	return -1
}

// cut returns how many leases have expired at now: the first expiry after
// now, by binary search.
func (s Concurrency) cut(now int64) int64 {
	lo, hi := int64(0), int64(len(s.Expiries))
	for lo < hi {
		mid := (lo + hi) / 2
		if s.Expiries[mid] <= now {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// live returns the index of lease id in s if it is held at now (its
// expiry lies after now), else -1.
func (s Concurrency) live(id string, now int64) int64 {
	i := s.find(id)
	if i < 0 || s.Expiries[i] <= now {
		return -1
	}
	return i
}

// Renew extends lease id to now + Params.Window when it is held; a lease
// that is not (it expired, or was never acquired) is acquired afresh if a
// slot is free, and denied otherwise.
func (s Concurrency) Renew(p Params, now int64, id string) (LeaseEdit, Decision) {
	if s.live(id, now) < 0 {
		return s.Decide(p, now, 1, id)
	}
	cut := s.cut(now)
	count := int64(len(s.Expiries)) - cut
	e := LeaseEdit{Cut: cut, Add: id, At: now + p.Window, Newest: max(s.Newest(), now+p.Window)}
	d := Decision{Allowed: true, Limit: p.Limit, Remaining: max(p.ceiling()-count, 0), ResetAfter: e.Newest - now}
	return e, d
}

// Decide acquires lease id at now when cost > 0 (one slot, whatever the
// cost), or peeks when cost is 0, and returns the edit (empty on a denial
// or a peek) and the decision. Acquiring a lease already held renews it.
// A denial's RetryAfter is the wait until enough leases expire for one
// more to fit.
func (s Concurrency) Decide(p Params, now, cost int64, id string) (LeaseEdit, Decision) {
	n := int64(len(s.Expiries))
	cut := s.cut(now)
	count := n - cut
	if cost > 0 && s.live(id, now) >= 0 {
		return s.Renew(p, now, id)
	}
	d := Decision{Limit: p.Limit}
	ceiling := p.ceiling()
	if count+1 > ceiling {
		// The lease whose expiry frees a slot: the (count+1-ceiling)-th soonest.
		d.Remaining = max(ceiling-count, 0) // count > Limit after a limit was lowered
		d.RetryAfter = s.Expiries[cut+count-ceiling] - now
		d.ResetAfter = s.Newest() - now
		return LeaseEdit{Newest: s.Newest()}, d
	}
	e := LeaseEdit{Cut: cut}
	if count > 0 {
		e.Newest = s.Newest()
	}
	held := count
	if cost > 0 {
		e.Add, e.At, e.Newest = id, now+p.Window, now+p.Window
		held++
	}
	d.Allowed = true
	d.Remaining = ceiling - held
	if e.Newest != 0 {
		d.ResetAfter = e.Newest - now
	}
	return e, d
}

// Release gives lease id back: harmless when it is not held (released
// before, expired, or never acquired). The decision is the peek after it,
// always Allowed.
func (s Concurrency) Release(p Params, now int64, id string) (LeaseEdit, Decision) {
	n := int64(len(s.Expiries))
	cut := s.cut(now)
	count := n - cut
	e := LeaseEdit{Cut: cut}
	i := s.live(id, now)
	left := count
	if i >= 0 {
		e.Remove = id
		left--
	}
	if left > 0 {
		e.Newest = s.Newest()
		if i == n-1 { // the newest is the one released
			e.Newest = s.Expiries[n-2]
		}
	}
	d := Decision{Allowed: true, Limit: p.Limit, Remaining: max(p.Limit-left, 0)}
	if e.Newest != 0 {
		d.ResetAfter = e.Newest - now
	}
	return e, d
}

// Expires returns the instant from which s equals an absent state: its
// latest expiry.
func (s Concurrency) Expires() int64 { return s.Newest() }
