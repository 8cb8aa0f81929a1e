package algorithm

import "fmt"

// The decision engine: what a store runs for one decision, whatever it
// keeps its state in. memstore calls Evaluate directly; redisstore's
// engine.lua ports this file function by function.

// Policy is what the engine needs of one policy: its algorithm and
// numbers, and for Check its name and the largest cost a request may ask.
type Policy struct {
	Kind    Kind
	Params  Params
	ID      string
	MaxCost int64
}

// State is the stored state of one policy for one subject, flat: exactly
// the integers a store keeps. A fixed-size algorithm keeps Fields[kind]
// integers in V, in the order of its fields method (redisstore writes them
// as one string); the sliding log keeps Log; concurrency keeps its
// leases' expiries in Log and their ids in IDs (see Concurrency). The
// zero value is absent.
type State struct {
	V   [5]int64
	Log []int64
	IDs []string
}

// Fields is how many integers of State.V each algorithm keeps.
var Fields = [...]int{KindFixedWindow: 3, KindSlidingLog: 0, KindSlidingWindow: 4, KindTokenBucket: 3, KindGCRA: 5, KindConcurrency: 0, KindFixedWindowEnd: 2, KindFixedPeriod: 3}

// Write is the state a decision leaves behind, for a store to keep when the
// whole evaluation commits.
type Write struct {
	V       [5]int64  // a fixed-size algorithm's new fields
	Log     LogEdit   // the sliding log's change
	Leases  LeaseEdit // concurrency's change
	Fresh   bool      // the stored state was read as absent (it expired): replace it, do not edit it
	Expires int64     // µs from which the written state equals absent; at or before the decision's time: delete it
}

// Evaluation is one decision for one subject over one or more policies:
// either every policy admits the cost and it is spent on all of them, or
// nothing is.
type Evaluation struct {
	Policies []Policy
	// States are the stored states, one per policy; nil is absent. They
	// are read, never modified.
	States []*State
	// Now is the time of the request, µs since the Unix epoch.
	Now int64
	// Op is what the evaluation does; Check says what it may carry.
	Op Op
	// Cost is the number of units to spend, refund, or spend beside an
	// acquired lease (≥ 1); 0 for every other operation.
	Cost int64
	// LeaseID is the lease an acquisition takes, a release gives back or
	// a renewal extends on every concurrency policy; "" for the others.
	LeaseID string
	// Hold is how long, µs, an OpHold holds: its Cost is a block its
	// caller admits itself over [Now, Now+Hold], spent so that it covers
	// every such admission (GCRA.Decide says how and why); for an OpBook,
	// the longest it may wait for its slot (book.go). 0 for every other
	// operation; Check says where it may be set.
	Hold int64
	// MaxRegression is how far Now may lie behind a state's newest write,
	// µs; further is a *ClockError. -1: unbounded.
	MaxRegression int64
	// Replay, when not nil, is the decision remembered for this
	// evaluation's id (see RecordID) and still live: Evaluate answers
	// with it and spends nothing.
	Replay []Decision
	// ReplayExtra is, for an OpSettle replayed, the Extra remembered
	// beside Replay (Record.Extra).
	ReplayExtra []int64
	// ReplayOthers is, for an OpSettle replayed, the policies after the
	// first it was first taken on (Record.Others).
	ReplayOthers string
	// Others is, for an OpEstimate or an OpSettle with an evaluation id,
	// the policies after the first as the store names their states
	// (Others): an estimate remembers it, a settle must name the same.
	Others string
	// Estimate is, for an OpSettle, the record remembered for the
	// estimate under the same id (RecordID(id, OpEstimate)), nil when
	// none is live: EvaluateSettle settles it.
	Estimate *Record

	// Decisions receives the Decision of each policy; the caller sizes it,
	// one element per policy.
	Decisions []Decision
	// Writes receives the Write of each policy; the caller sizes it, one
	// element per policy.
	Writes []Write
	// Commit reports that the store must apply every Write: the whole
	// evaluation admits, and it is not a peek (a reset always commits).
	Commit bool
	// Replayed reports that Decisions are Replay.
	Replayed bool
	// Extra receives, for an OpSettle, each policy's Settled (Charged,
	// GivenBack, Owed) in order: what a store remembers beside the
	// decisions (Record.Extra) and answers with them.
	Extra []int64
}

// ClockError says that a request's time lies further behind a state's
// newest write than Evaluation.MaxRegression allows, or (To != 0) that
// the time a calendar period's policy is decided at lies outside the
// periods its caller computed (FixedPeriod).
type ClockError struct {
	Policy       int   // index in Evaluation.Policies
	Behind, Max  int64 // µs
	At, From, To int64 // a period's: the time decided at, outside [From, To), µs
}

func (e *ClockError) Error() string {
	if e.To != 0 {
		return fmt.Sprintf("policy %d: time %d lies outside the periods [%d, %d) computed around the caller's clock", e.Policy, e.At, e.From, e.To)
	}
	return fmt.Sprintf("policy %d: caller clock is %d µs behind the last write, more than the allowed %d", e.Policy, e.Behind, e.Max)
}

// ReplayError says that an evaluation id was first used with another
// number of policies: an invalid request (ErrInvalidRequest), as the
// script's SLUICE_ARGS reply says it.
type ReplayError struct{ First, Now int }

func (e *ReplayError) Error() string {
	return fmt.Sprintf("the evaluation id was first used with %d policies, now with %d", e.First, e.Now)
}

// Unwrap returns ErrInvalidRequest: the caller's request, not the store,
// is at fault.
func (e *ReplayError) Unwrap() error { return ErrInvalidRequest }

// CorruptError says that a stored state, or the decisions remembered for
// an evaluation id, are none a decision of this engine leaves behind: the
// store must not decide on them (Unavailable, corrupt_state).
type CorruptError struct {
	Policy int    // index in Evaluation.Policies; -1: the remembered decisions (Evaluation.Replay)
	Reason string // what is wrong, e.g. "count 0: want 1 to 1000000000"
}

func (e *CorruptError) Error() string {
	if e.Policy < 0 {
		return "remembered decisions: " + e.Reason
	}
	return fmt.Sprintf("policy %d: %s", e.Policy, e.Reason)
}

// RecordCorrupt returns why ds, the decisions remembered for an
// evaluation id, are none an evaluation answers, or "": each within a
// capacity of 1 to MaxLimit with 0 <= Remaining <= Limit, its waits in
// [0, 2^53), and RetryAfter 0 exactly when Allowed. (The numbers of a
// policy may change under one revision, so they are held to what any
// policy answers, not to today's.) engine.lua's recordCorrupt ports it.
func RecordCorrupt(ds []Decision) string {
	for i := range ds {
		d := &ds[i]
		switch {
		case d.Limit < 1 || d.Limit > MaxLimit || d.Remaining < 0 || d.Remaining > d.Limit:
			return fmt.Sprintf("decision %d: limit %d, remaining %d: want 0 <= remaining <= limit, limit 1 to %d", i, d.Limit, d.Remaining, MaxLimit)
		case d.ResetAfter < 0 || d.ResetAfter >= MaxExact || d.RetryAfter < 0 || d.RetryAfter >= MaxExact:
			return fmt.Sprintf("decision %d: reset after %d, retry after %d µs: want each in [0, 2^53)", i, d.ResetAfter, d.RetryAfter)
		case d.Allowed != (d.RetryAfter == 0):
			return fmt.Sprintf("decision %d: allowed %t with retry after %d µs: want 0 exactly when allowed", i, d.Allowed, d.RetryAfter)
		}
	}
	return ""
}

// corrupt returns why st, a stored state of p (nil: absent), is none a
// decision under p leaves to keep at now, or "": the corruption bounds of
// each algorithm (FixedWindow.corrupt, …), relative to the state's own
// newest write, never to p's numbers, which may change under one revision.
// A state of all zeros is absent.
// records.lua's readState ports it (with the checks of the stored form
// itself: integers, −0, the type of the key); concurrency's leases are
// checked there as they are read.
func (p Policy) corrupt(st *State, now int64) string {
	if st == nil || st.V == absent.V && len(st.Log) == 0 {
		return "" // absent (a store that keeps what equals absent keeps zeros)
	}
	switch p.Kind {
	case KindFixedWindow:
		return fixedWindowOf(&st.V).corrupt()
	case KindFixedWindowEnd:
		return fixedWindowEndOf(&st.V).corrupt(now)
	case KindFixedPeriod:
		return fixedPeriodOf(&st.V).corrupt()
	case KindSlidingLog:
		return SlidingLog{Entries: st.Log}.corrupt(p.Params, now)
	case KindSlidingWindow:
		return slidingWindowOf(&st.V).corrupt()
	case KindTokenBucket:
		return tokenBucketOf(&st.V).corrupt()
	case KindGCRA:
		return gcraOf(&st.V).corrupt()
	}
	return ""
}

// bounds returns the instant from which st equals an absent state under p,
// and the time of its newest write.
func (p Policy) bounds(st *State) (expires, newest int64) {
	switch p.Kind {
	case KindFixedWindow:
		s := fixedWindowOf(&st.V)
		return s.Expires(p.Params), s.Newest()
	case KindFixedWindowEnd:
		s := fixedWindowEndOf(&st.V)
		return s.Expires(), s.Newest()
	case KindFixedPeriod:
		s := fixedPeriodOf(&st.V)
		return s.Expires(), s.Newest()
	case KindSlidingLog:
		s := SlidingLog{Entries: st.Log}
		return s.Expires(p.Params), s.Newest()
	case KindSlidingWindow:
		s := slidingWindowOf(&st.V)
		return s.Expires(p.Params), s.Newest()
	case KindTokenBucket:
		s := tokenBucketOf(&st.V)
		return s.Expires(p.Params), s.Newest()
	case KindGCRA:
		// Read twice rather than held: a GCRA (five fields) held in a
		// variable is copied whole from where it was built field by field.
		return gcraOf(&st.V).Expires(p.Params), gcraOf(&st.V).Newest()
	case KindConcurrency:
		s := Concurrency{Expiries: st.Log, IDs: st.IDs}
		if s.Newest() == 0 {
			return 0, 0
		}
		return s.Expires(), s.Newest() - p.Params.Window
	}
	return 0, 0
}

// absent is the state of a policy that has none.
var absent State

// step runs p's algorithm on st at now for o, a spend, held spend, peek,
// refund, acquisition, release, renewal or booking (a reset steps as a
// peek on absent state), of cost (0 for all but a spend, a held spend, a
// refund, an acquisition and a booking), held for hold µs (OpHold's; for
// an OpBook, the longest it may wait; 0 for every other) and the
// lease a concurrency policy takes, gives back or extends. It leaves the
// state after it in w, every field but Fresh (w may hold another
// decision's), and the verdict in d. A fixed window spends a held block
// as any spend: its caller ends the block at the window's end.
func (p Policy) step(st *State, now int64, o Op, cost, hold int64, lease string, w *Write, d *Decision) {
	refund := o == OpRefund
	w.Leases = LeaseEdit{}
	switch p.Kind {
	case KindFixedWindow:
		s := fixedWindowOf(&st.V)
		if refund {
			s, *d = s.Refund(p.Params, now, cost)
		} else {
			s, *d = s.Decide(p.Params, now, cost)
		}
		s.fields(&w.V)
		w.Log, w.Expires = LogEdit{}, s.Expires(p.Params)
	case KindFixedWindowEnd:
		s := fixedWindowEndOf(&st.V)
		if refund {
			s, *d = s.Refund(p.Params, now, cost)
		} else {
			s, *d = s.Decide(p.Params, now, cost)
		}
		s.fields(&w.V)
		w.Log, w.Expires = LogEdit{}, s.Expires()
	case KindFixedPeriod:
		w.Log, w.Expires = LogEdit{}, stepPeriod(p.Params, st, now, refund, cost, &w.V, d)
	case KindSlidingLog:
		s := SlidingLog{Entries: st.Log}
		if refund {
			w.Log, *d = s.Refund(p.Params, now, cost)
		} else {
			w.Log, *d = s.Decide(p.Params, now, cost)
		}
		w.V, w.Expires = [5]int64{}, 0
		if w.Log.Newest != 0 {
			w.Expires = w.Log.Newest + p.Params.Window
		}
	case KindSlidingWindow:
		// No Refund: a store never asks (Check refuses it first).
		s := slidingWindowOf(&st.V)
		s, *d = s.Decide(p.Params, now, cost)
		s.fields(&w.V)
		w.Log, w.Expires = LogEdit{}, s.Expires(p.Params)
	case KindTokenBucket:
		s := tokenBucketOf(&st.V)
		if refund {
			s, *d = s.Refund(p.Params, now, cost)
		} else if o == OpBook {
			s, *d = s.Book(p.Params, now, cost, hold)
		} else {
			s, *d = s.Decide(p.Params, now, cost, hold)
		}
		s.fields(&w.V)
		w.Log, w.Expires = LogEdit{}, s.Expires(p.Params)
	case KindGCRA:
		var s GCRA
		if refund {
			s, *d = gcraOf(&st.V).Refund(p.Params, now, cost)
		} else if o == OpBook {
			s, *d = gcraOf(&st.V).Book(p.Params, now, cost, hold)
		} else {
			s, *d = gcraOf(&st.V).Decide(p.Params, now, cost, hold)
		}
		s.fields(&w.V)
		w.Log, w.Expires = LogEdit{}, s.Expires(p.Params)
	case KindConcurrency:
		// No Refund: a store never asks (Check refuses it first).
		s := Concurrency{Expiries: st.Log, IDs: st.IDs}
		switch o {
		case OpRelease:
			w.Leases, *d = s.Release(p.Params, now, lease)
		case OpRenew:
			w.Leases, *d = s.Renew(p.Params, now, lease)
		case OpAcquire:
			w.Leases, *d = s.Decide(p.Params, now, 1, lease)
		default: // a peek
			w.Leases, *d = s.Decide(p.Params, now, 0, "")
		}
		w.V, w.Log, w.Expires = [5]int64{}, LogEdit{}, w.Leases.Newest
	}
}

// currentAt is current before a calendar period's bounds are held to.
func currentAt(p Policy, st *State, now, maxRegression int64) (*State, int64, *ClockError) {
	if st == nil {
		return &absent, now, nil
	}
	expires, newest := p.bounds(st)
	if expires <= now {
		return &absent, now, nil
	}
	at := now
	if newest > now {
		if maxRegression >= 0 && newest-now > maxRegression {
			return nil, 0, &ClockError{Behind: newest - now, Max: maxRegression}
		}
		at = newest
	}
	if expires <= at {
		return &absent, at, nil
	}
	return st, at, nil
}

// current returns the state p decides on for a request at now, and the
// time it decides at: a live state whose newest write lies after now is
// decided at that write's time (within maxRegression), and a state that
// equals absent by then is absent. A calendar period's policy is decided
// only at a time inside the periods its caller computed.
func current(p Policy, st *State, now, maxRegression int64) (*State, int64, *ClockError) {
	cur, at, err := currentAt(p, st, now, maxRegression)
	if err == nil && p.Kind == KindFixedPeriod {
		if err = p.Params.periodOutside(at); err != nil {
			return nil, 0, err
		}
	}
	return cur, at, err
}

// lengthen adds lag to the waits of d, which was decided lag µs after the
// request's own time. (Decisions are changed in place, never copied whole:
// a copy of a struct of five fields just written field by field costs a
// failed store-to-load forwarding on some CPUs, more than the math here.)
func lengthen(d *Decision, lag int64) {
	if d.RetryAfter > 0 {
		d.RetryAfter += lag
	}
	if d.ResetAfter > 0 {
		d.ResetAfter += lag
	}
}

// Evaluate decides ev: a remembered replay, or every policy on its state,
// all or nothing.
//
// The clock rule: a request whose time lies behind a state's newest write
// is decided at that write's time, so no algorithm ever sees time go
// backwards and they all agree on what it means; the waits it answers
// (RetryAfter, ResetAfter) are then lengthened by the lag, measured from
// the request's own time, never early.
//
// When several policies are named and one denies, nothing is spent, and
// each policy that would have admitted reports its unspent state (the
// peek's Remaining and ResetAfter), still Allowed.
//
// ev must have passed Check: Evaluate does not check the operation's rules
// again.
func Evaluate(ev *Evaluation) error {
	n := len(ev.Policies)
	if len(ev.States) != n || len(ev.Decisions) != n || len(ev.Writes) != n {
		return fmt.Errorf("evaluation of %d policies with %d states, %d decisions, %d writes", n, len(ev.States), len(ev.Decisions), len(ev.Writes))
	}
	ev.Commit, ev.Replayed = false, false
	if ev.Op == OpBook {
		return evaluateBook(ev)
	}
	if ev.Op == OpReset {
		for i, p := range ev.Policies {
			p.step(&absent, ev.Now, OpPeek, 0, 0, "", &ev.Writes[i], &ev.Decisions[i])
			ev.Writes[i].Fresh = true
		}
		ev.Commit = true
		return nil
	}
	if ev.Replay != nil {
		if len(ev.Replay) != n {
			return &ReplayError{First: len(ev.Replay), Now: n}
		}
		if why := RecordCorrupt(ev.Replay); why != "" {
			return &CorruptError{Policy: -1, Reason: why}
		}
		copy(ev.Decisions, ev.Replay)
		ev.Replayed = true
		return nil
	}
	for i, p := range ev.Policies {
		if why := p.corrupt(ev.States[i], ev.Now); why != "" {
			return &CorruptError{Policy: i, Reason: why}
		}
	}
	admitted := true
	for i, p := range ev.Policies {
		st, at, err := current(p, ev.States[i], ev.Now, ev.MaxRegression)
		if err != nil {
			err.Policy = i
			return err
		}
		w, d := &ev.Writes[i], &ev.Decisions[i]
		p.step(st, at, ev.Op, ev.Cost, ev.Hold, ev.LeaseID, w, d)
		w.Fresh = st != ev.States[i]
		if at != ev.Now {
			lengthen(d, at-ev.Now)
		}
		admitted = admitted && d.Allowed
	}
	if !admitted && n > 1 {
		for i, p := range ev.Policies {
			if ev.Decisions[i].Allowed {
				st, at, _ := current(p, ev.States[i], ev.Now, ev.MaxRegression)
				var w Write
				d := &ev.Decisions[i]
				p.step(st, at, OpPeek, 0, 0, "", &w, d)
				lengthen(d, at-ev.Now)
			}
		}
	}
	ev.Commit = admitted && ev.Op != OpPeek
	return nil
}

// Expires returns the instant from which st equals an absent state under
// p: a store may drop it then.
func (p Policy) Expires(st *State) int64 {
	expires, _ := p.bounds(st)
	return expires
}

// Apply changes st to the state w describes.
func (st *State) Apply(w *Write) {
	if w.Fresh {
		st.Log, st.IDs = st.Log[:0], st.IDs[:0]
	}
	// One field at a time: w.V was just written so, and a whole-array copy
	// would read it back before those stores land.
	st.V[0], st.V[1], st.V[2], st.V[3], st.V[4] = w.V[0], w.V[1], w.V[2], w.V[3], w.V[4]
	if w.Log != (LogEdit{}) {
		st.Log = SlidingLog{Entries: st.Log}.Apply(w.Log).Entries
	}
	if w.Leases != (LeaseEdit{}) {
		c := Concurrency{Expiries: st.Log, IDs: st.IDs}.Apply(w.Leases)
		st.Log, st.IDs = c.Expiries, c.IDs
	}
}
