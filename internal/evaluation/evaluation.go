// Package evaluation is what every store of this module does around the
// decision engine of internal/engine/algorithm: a sluice.Policy in the engine's
// terms, the engine's decision as a sluice.Status, a sluice.Clock's time in
// the engine's unit.
package evaluation

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/form"
	"github.com/sluicehq/sluice/internal/period"
	"github.com/sluicehq/sluice/internal/policydefaults"
)

// Policy returns p's algorithm and numbers in the engine's units. A
// policy with a calendar period is the engine's KindFixedPeriod, its
// bounds left zero: PolicyAt sets them.
func Policy(p *sluice.Policy) algorithm.Policy {
	var ap algorithm.Policy
	setPolicy(&ap, p)
	return ap
}

// setPolicy writes Policy(p) to ap, field by field.
func setPolicy(ap *algorithm.Policy, p *sluice.Policy) {
	ap.Kind = algorithm.Kind(p.Algorithm)
	if p.Period != "" {
		ap.Kind = algorithm.KindFixedPeriod
	}
	ap.Params.Limit, ap.Params.Window, ap.Params.Burst = p.Limit, Window(p), p.Burst
	ap.Params.Aligned, ap.Params.Reserve, ap.Params.Bounds = p.ClockAligned, 0, [4]int64{}
	ap.ID, ap.MaxCost = p.ID, p.MaxCost
}

// PolicyAt returns Policy(p), and for a policy with a calendar period its
// periods around now, the caller's clock in µs (from c: see
// period.Cache), with the middle one's length as its window.
func PolicyAt(p *sluice.Policy, now int64, c *period.Cache) algorithm.Policy {
	var ap algorithm.Policy
	SetPolicyAt(&ap, p, now, c)
	return ap
}

// SetPolicyAt writes PolicyAt(p, now, c) to ap, field by field: a
// Policy built whole and then returned is zeroed, filled and copied twice
// on the way, which on memstore's common decision cost more than the
// rest of the conversion.
func SetPolicyAt(ap *algorithm.Policy, p *sluice.Policy, now int64, c *period.Cache) {
	setPolicy(ap, p)
	if p.Period != "" {
		SetBounds(ap, Bounds(p, now, c))
	}
}

// Bounds returns the periods of p, a policy with a calendar period,
// around now (µs), from c: period.Bounds.
func Bounds(p *sluice.Policy, now int64, c *period.Cache) [4]int64 {
	u, _ := period.Parse(p.Period) // validated
	loc := p.TimeZone
	if loc == nil {
		loc = time.UTC
	}
	return c.Bounds(u, loc, now)
}

// SetBounds gives ap, a policy of KindFixedPeriod, the periods b.
func SetBounds(ap *algorithm.Policy, b [4]int64) {
	ap.Params.Bounds, ap.Params.Window = b, b[2]-b[1]
}

// Check reports whether ev breaks a rule of its operation, by the engine's
// Check, for a store that must know before it builds the engine's
// evaluation. room is room for ev's policies in the engine's terms (it
// may be nil: then they are allocated).
func Check(ev *sluice.Evaluation, room []algorithm.Policy) error {
	hold, err := Span(ev)
	if err != nil {
		return err
	}
	policies := room[:0]
	op := Op(ev)
	for _, p := range ev.Policies {
		ap := Policy(p)
		ap.Params.Reserve = int32(Reserve(p, ev.Priority, op)) // below MaxLimit
		policies = append(policies, ap)
	}
	return algorithm.Check(op, policies, ev.Cost, hold, ev.LeaseID, ev.EvaluationID != "")
}

// Reserve returns the units of p's capacity a decision of op for a
// request of class may not use (algorithm.Params.Reserve): what the
// class's share of p (Policy.Priorities) leaves to more important
// traffic, for an admission; 0 for a class p gives its whole capacity and
// for every operation that gives back or clears.
func Reserve(p *sluice.Policy, class string, op algorithm.Op) int64 {
	if len(p.Priorities) == 0 || !op.Admits() {
		return 0
	}
	return algorithm.Reserve(Capacity(p), algorithm.ShareOf(p.Priorities, class))
}

// Capacity returns the most units one decision of p could ever admit
// (algorithm.Params.Capacity): Burst for token_bucket and gcra, Limit
// for the others.
func Capacity(p *sluice.Policy) int64 {
	if p.Algorithm == sluice.TokenBucket || p.Algorithm == sluice.GCRA {
		return p.Burst
	}
	return p.Limit
}

// Short reports whether ev is in the short form, as the Limiter's
// validation recorded it (sluice's shortForm: one policy, no evaluation
// id, no older subject, no book; a spend or a peek of a rate policy, an
// acquire or a release of a concurrency one). It is the one way a store
// learns the form: a store's short course is entered on it alone, and
// answers exactly as its general course would.
func Short(ev *sluice.Evaluation) bool { return form.Short(ev) }

// Op returns ev's operation in the engine's terms: its Op, except that a
// Spend with a Hold is the engine's OpHold (local quota's held spend, which
// package sluice sends as a Spend with a Hold today).
func Op(ev *sluice.Evaluation) algorithm.Op {
	if ev.Op == sluice.Spend && ev.Hold != 0 {
		return algorithm.OpHold
	}
	return algorithm.Op(ev.Op)
}

// Hold returns h, a sluice.Evaluation's Hold, in the engine's µs, or an
// error when it is no whole number of them (the engine's Check has the
// rest of a held spend's rules).
func Hold(h time.Duration) (int64, error) {
	if h%time.Microsecond != 0 {
		return 0, fmt.Errorf("%w: hold = %v: must be a whole number of microseconds", algorithm.ErrInvalidRequest, h)
	}
	return int64(h / time.Microsecond), nil
}

// Span returns the engine's Hold of ev in µs: a held spend's Hold, or a
// Book's MaxWait; an error when it is no whole number of µs, or when ev
// carries the one its operation does not take.
func Span(ev *sluice.Evaluation) (int64, error) {
	switch {
	case ev.Op == sluice.Book && ev.Hold != 0:
		return 0, fmt.Errorf("%w: hold = %v: a book is not held", algorithm.ErrInvalidRequest, ev.Hold)
	case ev.Op == sluice.Book:
		if ev.MaxWait%time.Microsecond != 0 {
			return 0, fmt.Errorf("%w: max wait = %v: must be a whole number of microseconds", algorithm.ErrInvalidRequest, ev.MaxWait)
		}
		return int64(ev.MaxWait / time.Microsecond), nil
	case ev.MaxWait != 0:
		return 0, fmt.Errorf("%w: max wait = %v: only a book waits, not a %v", algorithm.ErrInvalidRequest, ev.MaxWait, ev.Op)
	}
	return Hold(ev.Hold)
}

// Window returns the period p's math runs on, µs: its Window, or for
// concurrency its LeaseTTL (how long a lease lives).
func Window(p *sluice.Policy) int64 {
	if p.Algorithm == sluice.Concurrency {
		return p.LeaseTTL.Microseconds()
	}
	return p.Window.Microseconds()
}

// SetStatus writes d, a decision of p, to st as a Status, field by field
// (a Status built whole and then copied is read back before its stores
// land, which stalls some CPUs longer than the rest of the conversion
// takes).
func SetStatus(st *sluice.Status, p *sluice.Policy, d *algorithm.Decision) {
	st.Policy = p.ID
	st.Allowed = d.Allowed
	st.Limit = d.Limit
	st.Remaining = d.Remaining
	st.ResetAfter = time.Duration(d.ResetAfter) * time.Microsecond
	st.RetryAfter = time.Duration(d.RetryAfter) * time.Microsecond
	st.Approximate = p.Algorithm == sluice.SlidingWindow
	st.Delay = time.Duration(d.Delay) * time.Microsecond
	st.Charged, st.GivenBack, st.Owed = 0, 0, 0
}

// SetSettled writes extra, a settle's Charged, GivenBack and Owed of each
// policy in order (algorithm.Evaluation.Extra), to statuses, written by
// SetStatus; an empty extra (any other operation) writes nothing.
func SetSettled(statuses []sluice.Status, extra []int64) {
	for i := 0; i+2 < len(extra) && i/3 < len(statuses); i += 3 {
		st := &statuses[i/3]
		st.Charged, st.GivenBack, st.Owed = extra[i], extra[i+1], extra[i+2]
	}
}

// Statuses returns statuses resized to n, reusing its capacity, for the
// SetStatus of each of n decisions.
func Statuses(statuses []sluice.Status, n int) []sluice.Status {
	if cap(statuses) >= n {
		return statuses[:n]
	}
	return make([]sluice.Status, n)
}

// Now returns c's time in integer microseconds since the Unix epoch, the
// engine's time unit. The default clock, clock.Monotonic, is
// recognised by its type (one comparison) and asked directly; any other
// clock with a UnixMicro method of its own is asked through it.
func Now(c sluice.Clock) int64 {
	if m, ok := c.(*clock.Monotonic); ok {
		return m.UnixMicro() // kept small enough to inline: the common case
	}
	return nowOf(c)
}

// nowOf is Now for a clock other than clock.Monotonic.
func nowOf(c sluice.Clock) int64 {
	if m, ok := c.(interface{ UnixMicro() int64 }); ok {
		return m.UnixMicro()
	}
	return c.Now().UnixMicro()
}

// Defaults returns p with every defaulted zero field filled in, by
// internal/policydefaults (the rules the root's Limiter applies), for a
// package above the root that holds a policy without a Limiter to ask
// (Limiter.Policy returns a Limiter's own, defaults applied). It does not
// validate.
func Defaults(p sluice.Policy) sluice.Policy {
	f := policydefaults.Fields{Kind: algorithm.Kind(p.Algorithm), Limit: p.Limit, Window: p.Window, LeaseTTL: p.LeaseTTL, Aligned: p.ClockAligned,
		Revision: p.Revision, Burst: p.Burst, MaxCost: p.MaxCost, DedupeTTL: p.DedupeTTL, DedupeMax: p.DedupeMax,
		LocalQuota: p.LocalQuota.Enabled, BlockTime: p.LocalQuota.BlockTime, MaxBlock: p.LocalQuota.MaxBlock, MaxWait: p.MaxWait}
	policydefaults.Apply(&f)
	p.Revision, p.Burst, p.MaxCost, p.DedupeTTL, p.DedupeMax = f.Revision, f.Burst, f.MaxCost, f.DedupeTTL, f.DedupeMax
	p.LocalQuota.BlockTime, p.LocalQuota.MaxBlock, p.MaxWait = f.BlockTime, f.MaxBlock, f.MaxWait
	return p
}

// CheckEstimate returns what the engine refuses of an estimate of cost on
// p, defaults applied (an algorithm that cannot settle, a bucket whose
// settle debt would pass 2^53 µs, a cost past max_cost), so a config can
// refuse when it loads what would otherwise fail on every request.
func CheckEstimate(p sluice.Policy, cost int64) error {
	d := Defaults(p)
	return algorithm.Check(algorithm.OpEstimate, []algorithm.Policy{Policy(&d)}, cost, 0, "", true)
}
