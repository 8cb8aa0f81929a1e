package algorithm

import (
	"fmt"
	"math/bits"
)

// GCRA is the state of the generic cell rate algorithm (a virtual
// scheduler).
//
// Model: each unit is due one emission interval T = Window/Limit µs after
// the previous one; the theoretical arrival time (TAT) is when the next unit
// would be on schedule. A request of cost c is admitted when
// max(TAT, now) + c·T − now ≤ Burst·T, i.e. when it is at most Burst units
// ahead of schedule. T is a fraction, so the TAT is kept as whole
// microseconds plus a remainder in 1/Limit µs, and every comparison is done
// scaled by Limit, exactly in integers.
//
// Burst: up to Burst at once after idling, then evenly spaced at the rate.
// Accuracy: exact. State: five integers: the TAT (whole µs and a
// remainder, for exactness), the Limit and Window it was scheduled under,
// and the time of the newest write. For the same Params, GCRA and
// TokenBucket admit exactly the same requests.
//
// After a policy's numbers change under the same revision, the units that
// were outstanding at the last write (rounded up, at most the new Burst)
// are rescheduled from that write at the new rate.
type GCRA struct {
	TAT    int64 // whole µs of the theoretical arrival time; 0 = absent
	Frac   int64 // remainder of the TAT in 1/Limit µs, 0 ≤ Frac < Limit
	Limit  int64 // the Params.Limit and Params.Window the TAT is scheduled under
	Window int64
	Last   int64 // µs of the newest write
}

// gcraOf reads a GCRA from the fields of a State.
func gcraOf(v *[5]int64) GCRA {
	return GCRA{TAT: v[0], Frac: v[1], Limit: v[2], Window: v[3], Last: v[4]}
}

// fields writes s as the fields of a State to v, one at a time (a
// [5]int64 built and then copied whole is read back before its stores
// land, which stalls some CPUs).
func (s GCRA) fields(v *[5]int64) {
	v[0], v[1], v[2], v[3], v[4] = s.TAT, s.Frac, s.Limit, s.Window, s.Last
}

// corrupt returns why s is no state Decide or Refund leaves to keep, or
// "". A kept schedule was written at Last >= 1 under a policy's limit and
// window, with a remainder below that limit; it ends after Last (one that
// does not equals absent and is deleted); and its debt at Last, (TAT −
// Last) × Limit + Frac, is at most that policy's burst × window: at most
// 10^9 × Window and below 2^53 − Limit. So the TAT lies at most burst ×
// emission interval after the newest write, whatever burst it had (a
// burst changed under one revision is kept, not rescheduled).
func (s GCRA) corrupt() string {
	if s.Last < 1 || s.Limit < 1 || s.Limit > MaxLimit || s.Window < MinWindow || s.Window > MaxWindow || s.Frac >= s.Limit || s.Frac < 0 {
		return fmt.Sprintf("last write %d, limit %d, window %d, remainder %d: want a write time, a policy's limit and window, a remainder below the limit", s.Last, s.Limit, s.Window, s.Frac)
	}
	most := MaxExact - 1 - s.Limit // min(that, MaxLimit × Window), without the product (it may pass 2^63)
	if s.Window <= most/MaxLimit {
		most = MaxLimit * s.Window
	}
	ahead := s.TAT - s.Last
	if ahead < 0 || ahead == 0 && s.Frac == 0 || beyond(ahead, s.Limit, most-s.Frac) {
		return fmt.Sprintf("TAT %d is %d µs after the last write: want after it by at most burst × %d / %d µs", s.TAT, ahead, s.Window, s.Limit)
	}
	return ""
}

// beyond reports whether a > ⌊x/l⌋ for a ≥ 0, x ≥ 0 and l ≥ 1, as gcra.lua
// asks it (a > quo(x, l)), without dividing: for a whole a, ⌊x/l⌋ < a
// exactly when x/l < a, when x < a·l; the product is taken in 128 bits,
// so it cannot overflow. Every decision on a stored GCRA asks it
// (corrupt); TestBeyond holds it to the quotient.
func beyond(a, l, x int64) bool {
	hi, lo := bits.Mul64(uint64(a), uint64(l))
	return hi != 0 || lo > uint64(x)
}

// scheduledUnder reports whether s needs no rescheduling under p: the
// common case, small enough to inline at every call.
func (s *GCRA) scheduledUnder(p Params) bool {
	return s.Limit == p.Limit && s.Window == p.Window || s.TAT == 0 || s.Limit == 0 || s.Window == 0
}

// reschedule returns s under p's numbers, which differ from the ones it
// was scheduled under: the units outstanding at Last, rounded up and at
// most p.Burst, scheduled from Last at p's rate. It depends on the state
// alone, so every read between two writes sees the same schedule.
func (s GCRA) reschedule(p Params) GCRA {
	var units int64 // nothing outstanding when the TAT is not after Last (a refund moved it)
	switch ahead := s.TAT - s.Last; {
	case ahead > (MaxExact-1-s.Frac)/s.Limit:
		units = p.Burst // scheduled absurdly far ahead: as many as fit
	case ahead >= 0:
		units = min(ceilDiv(ahead*s.Limit+s.Frac, s.Window), p.Burst)
	}
	debt := units * p.Window
	return GCRA{TAT: s.Last + debt/p.Limit, Frac: debt % p.Limit, Limit: p.Limit, Window: p.Window, Last: s.Last}
}

// Decide evaluates cost at now and returns the new state and the decision.
//
// hold > 0 makes it a held spend (Evaluation.Hold): the cost is spent as
// a block that a caller admits itself, unit by unit, at any times in
// [now, now+hold]. The debt is then taken as at least hold·Limit (the TAT
// as at least now + hold) before the cost is added, and the state is
// written at now (Last = now), as for any spend; hold 0 is the plain
// spend. Check bounds hold·Limit by Burst·Window.
//
// Why the block covers every unit used during the hold. Write S(t) for
// the stored debt (TAT − t scaled by Limit, at least 0): it falls by at
// most Limit per µs (it stops at 0), each admitted decision raises it by
// at least its cost·Window, and a held one to at least hold·Limit +
// cost·Window; an admission leaves S ≤ Burst·Window, so S(t) ≤
// Burst·Window at all t. (Times are the ones decisions are taken at, and
// a block's units are used within [its decision's time, that + hold].)
// Take any interval [a, b] and the units really used in it: plain spends
// admitted in it, blocks taken in it, and blocks taken at n < a whose
// hold reaches past a (n + h ≥ a). With no block of the last kind, S(b)
// ≥ (units of decisions in [a, b])·Window − (b − a)·Limit. Otherwise let
// n₁ be the earliest such block, of hold h₁ and cost k₁: S just after n₁
// is at least h₁·Limit + k₁·Window, every later decision adds at least
// its cost, so S(b) ≥ h₁·Limit + (all those units)·Window − (b − n₁)·Limit,
// and b − n₁ ≤ (b − a) + h₁. Either way (units used in [a, b])·Window ≤
// S(b) + (b − a)·Limit ≤ Burst·Window + (b − a)·Limit: at most Burst +
// ⌊(b − a)·Limit/Window⌋ units in any [a, b], the bound of the plain
// algorithm, whenever within its holds the units are used. Last stays
// now, not now + hold: the clock rule would decide a request arriving
// during the hold at now + hold, against the debt as it will be then,
// and admit it over the bound (burst 10, 5 units left, hold 5 T and cost
// 5: a request just after sees 5 units free at now + hold while all 10
// are in use).
func (s GCRA) Decide(p Params, now, cost, hold int64) (GCRA, Decision) {
	// The schedule decided on, held as two integers as gcra.lua holds it
	// (a second GCRA would be copied whole); the stored one is kept on a
	// denial.
	t, f := s.TAT, s.Frac
	if !s.scheduledUnder(p) {
		r := s.reschedule(p)
		t, f = r.TAT, r.Frac
	}
	tau := (p.Burst - int64(p.Reserve)) * p.Window // Burst·T, scaled by Limit, less the Reserve kept for a more important class
	need := verdictCost(cost) * p.Window
	d := Decision{Limit: p.Burst}
	// debt is (TAT − now) scaled by Limit, or 0 when the TAT is past.
	var debt int64
	if ahead := t - now; t != 0 && ahead >= 0 {
		if ahead > tau/p.Limit+1 {
			// Further ahead than any admissible debt; keeps ahead × Limit
			// from overflowing.
			d.RetryAfter = ahead - floorDiv(tau-need-f, p.Limit)
			d.ResetAfter = ahead + ceilDiv(f, p.Limit)
			return s, d
		}
		debt = ahead*p.Limit + f
	}
	debt = max(debt, hold*p.Limit) // a held spend's floor; hold·Limit ≤ tau
	// debt > tau − need, not debt + need > tau: the sum can pass 2^53
	// (a held spend's debt of hold·Limit beside a cost of Burst), where
	// gcra.lua's doubles round; the difference cannot (need ≤ tau).
	if debt > tau-need {
		d.Remaining = max(tau-debt, 0) / p.Window
		d.RetryAfter = ceilDiv(debt-(tau-need), p.Limit)
		d.ResetAfter = ceilDiv(debt, p.Limit)
		return s, d
	}
	if cost > 0 {
		debt += cost * p.Window
		s = GCRA{TAT: now + debt/p.Limit, Frac: debt % p.Limit, Limit: p.Limit, Window: p.Window, Last: now}
	}
	d.Allowed = true
	d.Remaining = (tau - debt) / p.Window
	d.ResetAfter = ceilDiv(debt, p.Limit)
	return s, d
}

// Expires returns the instant from which s equals an absent state.
func (s GCRA) Expires(p Params) int64 {
	if !s.scheduledUnder(p) {
		s = s.reschedule(p)
	}
	if s.TAT == 0 {
		return 0
	}
	return s.TAT + min(s.Frac, 1) // a remainder rounds up
}

// Refund moves the TAT back by n emission intervals, never before now. The
// decision is the peek after it, always Allowed: a refund cannot be denied.
func (s GCRA) Refund(p Params, now, n int64) (GCRA, Decision) {
	if !s.scheduledUnder(p) {
		s = s.reschedule(p)
	}
	if s.TAT != 0 {
		s.Last = now
		back := n * p.Window // n·T scaled by Limit, below 2^53 since n ≤ Burst
		s.TAT -= back / p.Limit
		if s.Frac -= back % p.Limit; s.Frac < 0 {
			s.Frac += p.Limit
			s.TAT--
		}
		if s.Expires(p) <= now {
			s = GCRA{} // no debt left: absent, as a store drops it
		}
	}
	_, d := s.Decide(p, now, 0, 0)
	d.Allowed, d.RetryAfter = true, 0
	return s, d
}

// Newest returns the time of the newest write to s.
func (s GCRA) Newest() int64 { return s.Last }

// Book evaluates a booking of cost (>= 1) at now that may wait up to
// mostWait µs (OpBook, book.go). When the cost fits now it is Decide's
// spend, Delay 0. Otherwise the cost fits once the schedule is Burst·T
// (less the class's Reserve, as in Decide) ahead of the clock no longer, in RetryAfter = ⌈(debt − (Burst − cost)·T)
// / T⌉ µs (debt: the TAT's lead on now); within mostWait the units are
// scheduled now after all the booked ones (the TAT moves on by cost·T,
// past Burst·T ahead) and the decision is admitted with that wait as its
// Delay and Remaining 0; beyond, it is Decide's denial and s is kept.
// Every admission, now or booked, thus keeps the schedule's invariant:
// a unit is admitted at a time no earlier than TAT − Burst·T, so any [a,
// b] holds at most Burst + ⌊(b − a)·Limit/Window⌋ admitted units, judged
// at their slots. The lead is at most Burst·T + mostWait, which Check
// bounds by MostWait, so debt·Limit stays exact.
func (s GCRA) Book(p Params, now, cost, mostWait int64) (GCRA, Decision) {
	t, f := s.TAT, s.Frac
	if !s.scheduledUnder(p) {
		r := s.reschedule(p)
		t, f = r.TAT, r.Frac
	}
	tau := (p.Burst - int64(p.Reserve)) * p.Window // less the Reserve kept for a more important class, as in Decide
	need := cost * p.Window
	var debt int64 // (TAT − now) scaled by Limit, or 0 when the TAT is past; corrupt bounds it
	if ahead := t - now; t != 0 && ahead >= 0 {
		debt = ahead*p.Limit + f
	}
	d := Decision{Limit: p.Burst}
	if debt > tau-need {
		wait := ceilDiv(debt-(tau-need), p.Limit)
		if wait > mostWait {
			d.Remaining = max(tau-debt, 0) / p.Window
			d.RetryAfter = wait
			d.ResetAfter = ceilDiv(debt, p.Limit)
			return s, d
		}
		d.Delay = wait
	}
	debt += need
	s = GCRA{TAT: now + debt/p.Limit, Frac: debt % p.Limit, Limit: p.Limit, Window: p.Window, Last: now}
	d.Allowed = true
	d.Remaining = max(tau-debt, 0) / p.Window
	d.ResetAfter = ceilDiv(debt, p.Limit)
	return s, d
}
