package algorithm

import "fmt"

// Booking a slot (OpBook): a request that does not fit now takes the
// earliest time its cost will, in the same decision, and is told how
// long to wait for it (Decision.Delay), so waiters in any number of
// processes are spaced at the rate without polling. Only the bucket
// algorithms have such a time: GCRA's theoretical arrival time is the
// schedule itself, and a token bucket's level may go below empty by the
// units booked ahead, refilled at the rate (GCRA.Book, TokenBucket.Book:
// the same bookings, as their Decide admits the same spends). A booking
// that would wait longer than the evaluation's most wait (Hold) is
// denied, as a spend is, and books nothing.
//
// The other algorithms have no future slot to book: a fixed window (and
// a calendar period) admits its whole limit again at once when the next
// one opens, so waiters booked into it would not be spaced but burst
// together at its start; a sliding log or window frees a unit only when
// an old one leaves it, an instant a booking would have to hold in the
// log ahead of time; concurrency frees a slot when a lease is released,
// which no clock foretells. For them a denial with its RetryAfter stays
// the answer: Check refuses a booking.

// MaxMostWait is the longest a booking may wait, µs: 24h.
const MaxMostWait int64 = 86_400_000_000

// MostWait returns the longest wait, µs, a booking on a bucket of p may
// be allowed (Hold of an OpBook): at most MaxMostWait, and short enough
// that the units booked ahead keep the state exact: Burst·Window plus the
// wait's refill, wait·Limit, at most what GCRA.corrupt accepts ahead of
// the newest write (min(2^53 − 1 − Limit, 10^9 × Window)). 0 when even
// a full bucket leaves no room.
func MostWait(p Params) int64 {
	most := MaxExact - 1 - p.Limit // without the product MaxLimit × Window (it may pass 2^63)
	if p.Window <= most/MaxLimit {
		most = MaxLimit * p.Window
	}
	return min(max(most-p.Burst*p.Window, 0)/p.Limit, MaxMostWait)
}

// checkBook reports whether a booking of cost may wait up to mostWait µs
// on policies, with the lease leaseID and, when remembered is set, an
// evaluation id: one policy of gcra or token_bucket, a cost of 1 to its
// MaxCost, a most wait of 0 to MostWait, no lease, no evaluation id (a
// replay would answer a slot already passed).
func checkBook(policies []Policy, cost, mostWait int64, leaseID string, remembered bool) error {
	switch {
	case len(policies) != 1:
		return fmt.Errorf("%w: a book names exactly one policy, not %d", ErrInvalidRequest, len(policies))
	case leaseID != "":
		return fmt.Errorf("%w: a book takes no lease id", ErrInvalidRequest)
	case remembered:
		return fmt.Errorf("%w: a book takes no evaluation id: a replay would answer a slot already passed", ErrInvalidRequest)
	case cost < 1:
		return fmt.Errorf("%w: cost = %d: a book takes a cost of 1 or more", ErrInvalidRequest, cost)
	}
	p := &policies[0]
	if p.Kind != KindGCRA && p.Kind != KindTokenBucket {
		return fmt.Errorf("policy %q: %w: a book on %v: only gcra and token_bucket have a future slot to book; a denial's retry-after is %v's answer", p.ID, ErrInvalidRequest, p.Kind, p.Kind)
	}
	switch most := MostWait(p.Params); {
	case cost > p.MaxCost:
		return fmt.Errorf("policy %q: cost = %d: %w %d", p.ID, cost, ErrCostTooHigh, p.MaxCost)
	case mostWait < 0 || mostWait > most:
		return fmt.Errorf("policy %q: %w: max wait = %dµs: must be between 0 and %dµs (at most 24h, and the units booked ahead must stay exact below 2^53)", p.ID, ErrInvalidRequest, mostWait, most)
	}
	return nil
}

// evaluateBook is Evaluate for an OpBook: its one policy booked on its
// state. The clock rule's lag (a state written after the request's time
// is decided at that write's time) is taken from the most wait first, and
// added to the delay after, so the delay counts from the request's own
// time and is never more than Hold.
func evaluateBook(ev *Evaluation) error {
	p := ev.Policies[0]
	if why := p.corrupt(ev.States[0], ev.Now); why != "" {
		return &CorruptError{Reason: why}
	}
	st, at, err := current(p, ev.States[0], ev.Now, ev.MaxRegression)
	if err != nil {
		return err
	}
	lag := at - ev.Now
	w, d := &ev.Writes[0], &ev.Decisions[0]
	p.step(st, at, OpBook, ev.Cost, ev.Hold-lag, "", w, d)
	w.Fresh = st != ev.States[0]
	if lag != 0 {
		lengthen(d, lag)
		if d.Delay > 0 {
			d.Delay += lag
		}
	}
	ev.Commit = d.Allowed
	return nil
}
