package algorithm

import (
	"fmt"
	"strings"
)

// Estimate → settle: a cost known only after the work (the tokens an LLM
// call used, the rows a query returned) is spent as an estimate first
// (OpEstimate: a spend, denied when it does not fit, remembered under its
// evaluation id with the estimated cost and the time it was spent at),
// then settled with the actual cost (OpSettle: one decision that gives
// the difference back, or charges the excess past the limit, and reports
// what it charged, gave back and left owed). A settle is remembered too,
// so a retry answers the same and changes nothing; an estimate never
// settled stays spent, and its record is forgotten at its deadline (the
// first policy's DedupeTTL). redisstore's settle.lua ports this file.
//
// What each algorithm does with the difference:
//
//   - token_bucket and gcra give back into the bucket (never above full)
//     and charge the excess as debt: the level goes below empty (the TAT
//     further ahead), carried into the time after, so nothing is admitted
//     until the rate has paid it off. The debt is at most one full bucket
//     (Burst units) beyond empty; Check refuses a bucket whose doubled
//     burst × window would not stay exact below 2^53.
//   - fixed_window gives back only into the window the estimate was spent
//     in, while it is open (a window that closed took its budget with
//     it). The excess is counted in the window open at the settle: the
//     estimate's, when it still is; once it has closed, counting there
//     would change nothing (a closed window admits nothing more), so the
//     excess is carried into the current one, as a bucket carries its
//     debt. A window counts at most twice its limit. A calendar period
//     (FixedPeriod) likewise: the difference goes back only into the
//     period the estimate was spent in, while it is open, and the excess
//     is counted in the period open at the settle (a later period, when
//     the estimate's has ended: the month a bill is for has closed, and
//     what was owed in it is owed now, as a bucket's debt).
//   - sliding_log gives back only while the estimate's entries are the
//     newest in the log (nothing spent since): they are then the ones
//     removed; an older unit cannot be taken out of the middle of the log.
//     The excess is logged at the settle's time, not the estimate's: the
//     log stays in order, and each unit stays in it for a whole window
//     from then, never less than one dated at the estimate would. A log
//     holds at most twice its limit in the window.
//   - sliding_window cannot give back (after its window rolls over a unit
//     is only a share of an estimate) and concurrency counts leases, not
//     units: Check refuses both.

// Settled is what a settle did to one policy, in units. Example: an
// estimate of 100 settled at 130 on a bucket with 10 left: Charged 30,
// GivenBack 0, Owed 20.
type Settled struct {
	Charged   int64 // of the actual cost beyond the estimate, the units charged (past the limit if need be)
	GivenBack int64 // of the estimate beyond the actual cost, the units given back
	Owed      int64 // after the settle, the units spent beyond the policy's capacity, to be paid off before it admits again
}

// Record is what a store remembers under a record id (RecordID): the
// decisions of the first evaluation and, for an estimate or a settle,
// Extra: an estimate's cost and the time it was spent at (µs), or a
// settle's Charged, GivenBack and Owed of each policy in order; and
// Others, the policies after the first it was taken on (Others). The
// record lies under the first policy's key of its subject, so the two
// name every state its estimate spent.
type Record struct {
	Decisions []Decision
	Extra     []int64
	Others    string
}

// Others returns what a store remembers beside an estimate or a settle
// over the policies whose states it names names, in order (Record.Others,
// Evaluation.Others): the names after the first, joined by ','; "" for
// one policy. A store's names are its keys without the subject (a policy
// id, its revision and the form of its state), so they hold no ','.
func Others(names []string) string {
	if len(names) < 2 {
		return ""
	}
	return strings.Join(names[1:], ",")
}

// errOtherPolicies refuses a settle that names other policies than its
// estimate spent, or the same in another order: it would give back what
// they never spent.
var errOtherPolicies = fmt.Errorf("%w: the estimate under this evaluation id was spent on other policies: a settle names exactly its estimate's policies, in the same order", ErrInvalidRequest)

// EstimateExtra returns the Extra a store remembers beside an estimate's
// decisions: its cost and the time, µs, it was spent at.
func EstimateExtra(cost, now int64) []int64 { return []int64{cost, now} }

// checkSettle reports whether op, an estimate or a settle, may be taken on
// policies with cost and, when remembered is set, an evaluation id, with
// a lease id leaseID and a hold of hold µs: both need the id (a settle
// finds its estimate by it) and neither takes a lease or a hold; an
// estimate costs 1 to the policies' MaxCost, a settle's actual cost is 0
// to MaxLimit; and each policy must be able to give back and carry debt.
func checkSettle(op Op, policies []Policy, cost, hold int64, leaseID string, remembered bool) error {
	switch {
	case !remembered:
		return fmt.Errorf("%w: %s needs an evaluation id: the settle finds its estimate by it", ErrInvalidRequest, op.named())
	case leaseID != "":
		return fmt.Errorf("%w: %s takes no lease id", ErrInvalidRequest, op.named())
	case hold != 0:
		return fmt.Errorf("%w: hold = %dµs: %s is not held", ErrInvalidRequest, hold, op.named())
	case op == OpEstimate && cost < 1:
		return fmt.Errorf("%w: cost = %d: an estimate takes a cost of 1 or more", ErrInvalidRequest, cost)
	case op == OpSettle && (cost < 0 || cost > MaxLimit):
		return fmt.Errorf("%w: cost = %d: a settle takes the actual cost, 0 to %d", ErrInvalidRequest, cost, MaxLimit)
	}
	for i := range policies {
		p := &policies[i]
		if err := checkReserve(op, p, cost); err != nil {
			return err
		}
		switch {
		case p.Kind == KindSlidingWindow:
			return fmt.Errorf("policy %q: %w by sliding_window: %s needs to give back, and after its window rolls over a unit is only a share of an estimate", p.ID, ErrNotRefundable, op.named())
		case p.Kind == KindConcurrency:
			return fmt.Errorf("policy %q: %w: %s on concurrency: it counts leases, not units; there is no cost to settle", p.ID, ErrInvalidRequest, op.named())
		case (p.Kind == KindTokenBucket || p.Kind == KindGCRA) && p.Params.Burst > (MaxExact-1-p.Params.Limit)/(2*p.Params.Window):
			return fmt.Errorf("policy %q: %w: %s on %v: a settle carries up to a full bucket of debt, so 2 × burst × window in µs must stay below 2^53; at this window the burst can be at most %d", p.ID, ErrInvalidRequest, op.named(), p.Kind, (MaxExact-1-p.Params.Limit)/(2*p.Params.Window))
		case op == OpEstimate && cost > p.MaxCost:
			return fmt.Errorf("policy %q: cost = %d: %w %d", p.ID, cost, ErrCostTooHigh, p.MaxCost)
		}
	}
	return nil
}

// settledMost returns the most units a policy of capacity c counts once
// a settle has charged past it: twice its capacity (a capacity of debt
// beyond it), and at most most, the bound its stored state is held to
// (MaxLimit; a log's MaxSlidingLogLen entries), so a settled state is one
// the corruption checks accept.
func settledMost(c, most int64) int64 { return min(2*c, most) }

// settleCount says what a settle does to count spent units: back says
// whether the estimate can still be given back (the units go back, at
// most count of them), and an excess is counted up to most. touched
// says whether it changed anything (the state is written at now).
func settleCount(count, delta int64, back bool, most int64) (out Settled, touched bool) {
	switch {
	case delta < 0 && back:
		out.GivenBack = min(-delta, count)
	case delta > 0:
		out.Charged = min(delta, max(most-count, 0))
	default:
		return out, false
	}
	return out, true
}

// FixedWindow.Settle replaces an estimate spent at spentAt with a cost
// delta units higher (lower, when negative), at now: see the file's
// comment. The decision is the peek after it, always Allowed.
func (s FixedWindow) Settle(p Params, now, spentAt, delta int64) (FixedWindow, Decision, Settled) {
	cur, _ := s.Decide(p, now, 0) // the window open at now: s's, or a fresh one
	out, touched := settleCount(cur.Count, delta, cur.Start <= spentAt, settledMost(p.Limit, MaxLimit))
	if touched {
		cur = FixedWindow{Start: cur.Start, Count: cur.Count + out.Charged - out.GivenBack, Last: now}
	}
	if cur.Expires(p) <= now {
		cur = FixedWindow{} // nothing left to remember: absent, as a store drops it
	}
	_, d := cur.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	out.Owed = max(cur.Count-p.Limit, 0)
	return cur, d, out
}

// FixedWindowEnd.Settle is FixedWindow.Settle on a window kept by its end.
func (s FixedWindowEnd) Settle(p Params, now, spentAt, delta int64) (FixedWindowEnd, Decision, Settled) {
	cur, _ := s.Decide(p, now, 0)
	out, _ := settleCount(cur.Count, delta, cur.End-p.Window <= spentAt, settledMost(p.Limit, MaxLimit))
	cur.Count += out.Charged - out.GivenBack
	if cur.Expires() <= now {
		cur = FixedWindowEnd{}
	}
	_, d := cur.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	out.Owed = max(cur.Count-p.Limit, 0)
	return cur, d, out
}

// FixedPeriod.Settle is FixedWindow.Settle on calendar periods: the
// difference goes back only when the estimate was spent in the period
// open at now (the period of p.Bounds holding spentAt ends where the
// state's does), and the excess is counted in that period.
func (s FixedPeriod) Settle(p Params, now, spentAt, delta int64) (FixedPeriod, Decision, Settled) {
	cur, _ := s.Decide(p, now, 0) // the period open at now: s's, or a fresh one
	out, touched := settleCount(cur.Count, delta, p.periodEnd(spentAt) == cur.End, settledMost(p.Limit, MaxLimit))
	if touched {
		cur.Count, cur.Last = cur.Count+out.Charged-out.GivenBack, now
	}
	if cur.Expires() <= now {
		cur = FixedPeriod{} // nothing left to remember: absent, as a store drops it
	}
	_, d := cur.Decide(p, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	out.Owed = max(cur.Count-p.Limit, 0)
	return cur, d, out
}

// SlidingLog.Settle returns the edit that replaces an estimate spent at
// spentAt with a cost delta units higher (lower, when negative), at now,
// and the decision after it, always Allowed: see the file's comment.
func (s SlidingLog) Settle(p Params, now, spentAt, delta int64) (LogEdit, Decision, Settled) {
	cut := s.cut(p, now)
	count := int64(len(s.Entries)) - cut
	out, _ := settleCount(count, delta, count > 0 && s.Newest() == spentAt, settledMost(p.Limit, MaxSlidingLogLen))
	e := LogEdit{Cut: cut, Drop: out.GivenBack}
	left := count - e.Drop
	if left > 0 {
		e.Newest = s.Entries[cut+left-1]
	}
	if out.Charged > 0 {
		e.Add, e.At, e.Newest = out.Charged, now, now
		left += out.Charged
	}
	d := Decision{Allowed: true, Limit: p.Limit, Remaining: max(p.Limit-left, 0)}
	if e.Newest != 0 {
		d.ResetAfter = e.Newest + p.Window - now
	}
	out.Owed = max(left-p.Limit, 0)
	return e, d, out
}

// TokenBucket.Settle replaces an estimate with a cost delta units higher
// (lower, when negative) at now: the difference goes back into the
// bucket, never above full, or is taken out of it, down to one full
// bucket below empty. The decision is the peek after it, always Allowed.
func (s TokenBucket) Settle(p Params, now, delta int64) (TokenBucket, Decision, Settled) {
	var out Settled
	full := p.Burst * p.Window
	level := s.level(p, now)
	switch {
	case delta < 0:
		// Compared in units first: -delta × Window may pass 2^53.
		if out.GivenBack = ceilDiv(full-level, p.Window); -delta < out.GivenBack {
			out.GivenBack, level = -delta, level-delta*p.Window
		} else {
			level = full
		}
	case delta > 0:
		out.Charged = min(delta, max(floorDiv(level-full, p.Window)+settledMost(p.Burst, MaxLimit), 0))
		level -= out.Charged * p.Window
	}
	s = TokenBucket{Tokens: level, Last: now, Window: p.Window}
	if s.Expires(p) <= now {
		s = TokenBucket{} // full: absent, as a store drops it
	}
	_, d := s.Decide(p, now, 0, 0)
	d.Allowed, d.RetryAfter = true, 0
	out.Owed = ceilDiv(max(-level, 0), p.Window)
	return s, d, out
}

// GCRA.Settle replaces an estimate with a cost delta units higher (lower,
// when negative) at now: the TAT moves back by the difference, never
// before now, or ahead by the excess, up to one full bucket of debt
// beyond Burst (2 × Burst × T ahead of now). The decision is the peek
// after it, always Allowed.
func (s GCRA) Settle(p Params, now, delta int64) (GCRA, Decision, Settled) {
	var out Settled
	if !s.scheduledUnder(p) {
		s = s.reschedule(p)
	}
	tau := p.Burst * p.Window
	var debt int64 // (TAT − now) scaled by Limit, or 0 when the TAT is past
	if ahead := s.TAT - now; s.TAT != 0 && ahead >= 0 {
		debt = ahead*p.Limit + s.Frac
	}
	switch {
	case delta < 0:
		// Compared in units first: -delta × Window may pass 2^53.
		if out.GivenBack = ceilDiv(debt, p.Window); -delta < out.GivenBack {
			out.GivenBack, debt = -delta, debt+delta*p.Window
		} else {
			debt = 0
		}
	case delta > 0:
		out.Charged = min(delta, max(settledMost(p.Burst, MaxLimit)-ceilDiv(debt, p.Window), 0))
		debt += out.Charged * p.Window
	}
	s = GCRA{TAT: now + debt/p.Limit, Frac: debt % p.Limit, Limit: p.Limit, Window: p.Window, Last: now}
	if debt == 0 {
		s = GCRA{} // no debt left: absent, as a store drops it
	}
	_, d := s.Decide(p, now, 0, 0)
	d.Allowed, d.RetryAfter = true, 0
	out.Owed = ceilDiv(max(debt-tau, 0), p.Window)
	return s, d, out
}

// settle runs p's algorithm's Settle on st at now for an estimate spent at
// spentAt and a cost delta units off it, leaving the state after it in w
// (every field but Fresh), the decision in d and what it did in out.
func (p Policy) settle(st *State, now, spentAt, delta int64, w *Write, d *Decision, out *Settled) {
	w.Leases = LeaseEdit{}
	w.Log = LogEdit{}
	switch p.Kind {
	case KindFixedWindow:
		var s FixedWindow
		s, *d, *out = fixedWindowOf(&st.V).Settle(p.Params, now, spentAt, delta)
		s.fields(&w.V)
		w.Expires = s.Expires(p.Params)
	case KindFixedWindowEnd:
		var s FixedWindowEnd
		s, *d, *out = fixedWindowEndOf(&st.V).Settle(p.Params, now, spentAt, delta)
		s.fields(&w.V)
		w.Expires = s.Expires()
	case KindFixedPeriod:
		var s FixedPeriod
		s, *d, *out = fixedPeriodOf(&st.V).Settle(p.Params, now, spentAt, delta)
		s.fields(&w.V)
		w.Expires = s.Expires()
	case KindSlidingLog:
		w.Log, *d, *out = SlidingLog{Entries: st.Log}.Settle(p.Params, now, spentAt, delta)
		w.V, w.Expires = [5]int64{}, 0
		if w.Log.Newest != 0 {
			w.Expires = w.Log.Newest + p.Params.Window
		}
	case KindTokenBucket:
		var s TokenBucket
		s, *d, *out = tokenBucketOf(&st.V).Settle(p.Params, now, delta)
		s.fields(&w.V)
		w.Expires = s.Expires(p.Params)
	case KindGCRA:
		var s GCRA
		s, *d, *out = gcraOf(&st.V).Settle(p.Params, now, delta)
		s.fields(&w.V)
		w.Expires = s.Expires(p.Params)
	}
}

// EstimateCorrupt returns why extra, remembered beside an estimate's
// decisions, is none an estimate leaves, or "": its cost, 1 to MaxLimit,
// and the time it was spent at, in [1, 2^53).
func EstimateCorrupt(extra []int64) string {
	switch {
	case len(extra) != 2:
		return fmt.Sprintf("an estimate holds %d integers beside its decisions: want 2", len(extra))
	case extra[0] < 1 || extra[0] > MaxLimit || extra[1] < 1 || extra[1] >= MaxExact:
		return fmt.Sprintf("estimate of %d spent at %d: want a cost of 1 to %d and a time in [1, 2^53)", extra[0], extra[1], MaxLimit)
	}
	return ""
}

// SettledCorrupt returns why extra, remembered beside a settle's
// decisions over n policies, is none a settle leaves, or "": three
// integers per policy, each 0 to MaxLimit.
func SettledCorrupt(extra []int64, n int) string {
	if len(extra) != 3*n {
		return fmt.Sprintf("a settle holds %d integers beside its %d decisions: want %d", len(extra), n, 3*n)
	}
	for i, v := range extra {
		if v < 0 || v > MaxLimit {
			return fmt.Sprintf("settled value %d = %d: want 0 to %d", i, v, MaxLimit)
		}
	}
	return ""
}

// estimateOf returns the time the estimate rec (nil: none live) was spent
// at and its cost, for a settle over n policies whose others are others
// (Others), or why it cannot be settled: a record of another number of
// policies (*ReplayError), one no estimate leaves (*CorruptError), an
// estimate spent on other policies, or a denied or missing estimate.
func estimateOf(rec *Record, n int, others string) (spentAt, cost int64, err error) {
	switch {
	case rec == nil:
		return 0, 0, fmt.Errorf("%w: no estimate to settle under this evaluation id: none was spent with it on these policies for this subject, or its deadline passed (an estimate never settled stays spent)", ErrInvalidRequest)
	case len(rec.Decisions) != n:
		return 0, 0, &ReplayError{First: len(rec.Decisions), Now: n}
	}
	if why := RecordCorrupt(rec.Decisions); why != "" {
		return 0, 0, &CorruptError{Policy: -1, Reason: why}
	}
	if why := EstimateCorrupt(rec.Extra); why != "" {
		return 0, 0, &CorruptError{Policy: -1, Reason: why}
	}
	if rec.Others != others {
		return 0, 0, errOtherPolicies
	}
	for i := range rec.Decisions {
		if !rec.Decisions[i].Allowed {
			return 0, 0, fmt.Errorf("%w: the estimate under this evaluation id was denied: nothing was spent, nothing to settle", ErrInvalidRequest)
		}
	}
	return rec.Extra[1], rec.Extra[0], nil
}

// LookupFor hands ev, whose record id is id (RecordID) for the
// evaluation id evaluationID, what look finds remembered under a record
// id and still live: the decision to replay (with its Extra, for a
// settle) and, for a settle, the estimate it settles. memstore looks in a
// DedupeLog, settle.lua's lookupFor in the id keys.
func LookupFor(ev *Evaluation, evaluationID, id string, look func(id string) (Record, bool)) {
	if r, ok := look(id); ok {
		ev.Replay, ev.ReplayExtra, ev.ReplayOthers = r.Decisions, r.Extra, r.Others
	}
	if ev.Op == OpSettle {
		if r, ok := look(RecordID(evaluationID, OpEstimate)); ok {
			ev.Estimate = &r
		}
	}
}

// EvaluateSettle decides ev, an OpSettle that passed Check, as Evaluate
// decides any other operation (the same clock rule): a remembered settle
// (ev.Replay, its Extra in ev.ReplayExtra) is answered again; otherwise
// the estimate remembered under the id (ev.Estimate) is replaced by the
// actual cost, ev.Cost, on every policy, in one decision that always
// commits. Either holds only for the policies remembered (ev.Others
// against ReplayOthers, or the estimate's): a settle naming others is
// refused, and writes nothing. Extra receives each policy's Charged, GivenBack and Owed, in
// order: what the store remembers beside the decisions, and answers.
func EvaluateSettle(ev *Evaluation) error {
	n := len(ev.Policies)
	if len(ev.States) != n || len(ev.Decisions) != n || len(ev.Writes) != n {
		return fmt.Errorf("evaluation of %d policies with %d states, %d decisions, %d writes", n, len(ev.States), len(ev.Decisions), len(ev.Writes))
	}
	ev.Commit, ev.Replayed, ev.Extra = false, false, ev.Extra[:0]
	if ev.Replay != nil {
		if len(ev.Replay) != n {
			return &ReplayError{First: len(ev.Replay), Now: n}
		}
		why := RecordCorrupt(ev.Replay)
		if why == "" {
			why = SettledCorrupt(ev.ReplayExtra, n)
		}
		if why != "" {
			return &CorruptError{Policy: -1, Reason: why}
		}
		if ev.ReplayOthers != ev.Others {
			return errOtherPolicies
		}
		copy(ev.Decisions, ev.Replay)
		ev.Extra, ev.Replayed = append(ev.Extra, ev.ReplayExtra...), true
		return nil
	}
	spentAt, estimate, err := estimateOf(ev.Estimate, n, ev.Others)
	if err != nil {
		return err
	}
	for i, p := range ev.Policies {
		if why := p.corrupt(ev.States[i], ev.Now); why != "" {
			return &CorruptError{Policy: i, Reason: why}
		}
	}
	for i, p := range ev.Policies {
		st, at, cerr := current(p, ev.States[i], ev.Now, ev.MaxRegression)
		if cerr != nil {
			cerr.Policy = i
			return cerr
		}
		var out Settled
		w, d := &ev.Writes[i], &ev.Decisions[i]
		p.settle(st, at, spentAt, ev.Cost-estimate, w, d, &out)
		w.Fresh = st != ev.States[i]
		if at != ev.Now {
			lengthen(d, at-ev.Now)
		}
		ev.Extra = append(ev.Extra, out.Charged, out.GivenBack, out.Owed)
	}
	ev.Commit = true
	return nil
}
