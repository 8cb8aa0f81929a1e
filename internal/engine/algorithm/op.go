package algorithm

import (
	"errors"
	"fmt"
)

// Op is what one evaluation does. Each operation's rules (which policies
// it may name, what cost it takes, what it carries) are checked here once,
// by Check, for every store.
type Op uint8

// The operations. The zero value is OpSpend.
const (
	// OpSpend spends Cost (≥ 1) units of every policy, all of them rate
	// policies.
	OpSpend Op = iota
	// OpPeek reads every policy's state, judged as a spend of 1, and
	// changes nothing. Cost 0.
	OpPeek
	// OpRefund gives Cost (≥ 1) units back to every policy, each of a
	// refundable algorithm (not sliding_window, not concurrency).
	OpRefund
	// OpReset clears every policy's state, whatever it holds. Cost 0, no
	// evaluation id.
	OpReset
	// OpAcquire acquires the lease LeaseID on every concurrency policy it
	// names (at least one) and spends Cost (≥ 1) units of every rate
	// policy beside them, all or nothing.
	OpAcquire
	// OpRelease gives the lease LeaseID back on every policy, all of them
	// concurrency policies: always admitted. Cost 0, no evaluation id.
	OpRelease
	// OpRenew extends the lease LeaseID on every policy, all of them
	// concurrency policies, acquiring it afresh where it is not held.
	// Cost 0, no evaluation id.
	OpRenew
	// OpHold spends Cost (>= 1) units of one policy as a block its caller
	// admits itself over [Now, Now+Hold] (Evaluation.Hold, >= 1µs), spent
	// so that it covers every such admission (GCRA.Decide says how and
	// why): local quota's held spend. One policy of fixed_window,
	// token_bucket or gcra, no evaluation id (a replay would hand out the
	// block twice). Package sluice has no Op of its own for it yet: a
	// Spend with a Hold is this (evaluation.Op).
	OpHold
	// OpEstimate spends Cost (>= 1) units of every policy exactly as a
	// spend, and the store remembers it under the evaluation id (which it
	// needs) with its cost and time, until the first policy's DedupeTTL,
	// for an OpSettle (settle.go). Policies of fixed_window, sliding_log,
	// token_bucket or gcra.
	OpEstimate
	// OpSettle replaces the estimate remembered under the evaluation id
	// with the actual cost, Cost (0 or more): settle.go.
	OpSettle
	// OpBook spends Cost (>= 1) units of one gcra or token_bucket policy
	// now when they fit, and otherwise books the earliest time they will:
	// admitted with Decision.Delay, the wait until that slot, when it is
	// at most the evaluation's most wait (Evaluation.Hold's µs), denied
	// beyond, booking nothing: book.go. No evaluation id.
	OpBook
)

var opNames = [...]string{"spend", "peek", "refund", "reset", "acquire", "release", "renew", "hold", "estimate", "settle", "book"}

// String returns the operation's name, e.g. "refund": its spelling in the
// script's arguments and in the check API.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// The rules an evaluation can break, matched with errors.Is; package
// sluice exports them as its own.
var (
	ErrInvalidRequest = errors.New("invalid request")
	ErrCostTooHigh    = errors.New("cost above policy maximum")
	ErrNotRefundable  = errors.New("refund not supported")
)

// named returns o with its article, for messages: "a refund", "an acquire".
func (o Op) named() string {
	if o == OpAcquire || o == OpEstimate {
		return "an " + o.String()
	}
	return "a " + o.String()
}

// spends reports whether o takes a cost of 1 or more.
func (o Op) spends() bool { return o == OpSpend || o == OpRefund || o == OpAcquire || o == OpHold }

// leased reports whether o names a lease.
func (o Op) leased() bool { return o == OpAcquire || o == OpRelease || o == OpRenew }

// Check reports whether op may be taken on policies with cost, held for
// hold µs (Evaluation.Hold: OpHold's hold, OpBook's most wait, 0 for
// every other operation), with
// the lease leaseID ("" for none) and,
// when remembered is set, an evaluation id: the rules of each operation,
// in one place. A store checks an evaluation with it before it reads or
// writes any state; Evaluate assumes it passed.
func Check(op Op, policies []Policy, cost, hold int64, leaseID string, remembered bool) error {
	if op == OpSpend && len(policies) > 0 && cost >= 1 && hold == 0 && leaseID == "" {
		// The common case, a spend within every policy's maximum, is
		// answered by this one loop, before the switch of every rule.
		i := 0
		for i < len(policies) && policies[i].Kind != KindConcurrency && cost <= policies[i].MaxCost && policies[i].Params.Reserve == 0 {
			i++
		}
		if i == len(policies) {
			return nil
		}
	}
	return check(op, policies, cost, hold, leaseID, remembered)
}

// check is Check for every case.
func check(op Op, policies []Policy, cost, hold int64, leaseID string, remembered bool) error {
	switch {
	case int(op) >= len(opNames):
		return fmt.Errorf("%w: unknown operation %v", ErrInvalidRequest, op)
	case len(policies) == 0:
		return fmt.Errorf("%w: %v names no policy", ErrInvalidRequest, op)
	case op == OpEstimate || op == OpSettle:
		return checkSettle(op, policies, cost, hold, leaseID, remembered)
	case op == OpBook:
		return checkBook(policies, cost, hold, leaseID, remembered)
	case op.spends() && cost < 1:
		return fmt.Errorf("%w: cost = %d: %s takes a cost of 1 or more", ErrInvalidRequest, cost, op.named())
	case !op.spends() && cost != 0:
		return fmt.Errorf("%w: cost = %d: %s takes no cost, leave it 0", ErrInvalidRequest, cost, op.named())
	case op.leased() && leaseID == "":
		return fmt.Errorf("%w: %s needs a lease id", ErrInvalidRequest, op.named())
	case !op.leased() && leaseID != "":
		return fmt.Errorf("%w: %s takes no lease id", ErrInvalidRequest, op.named())
	case remembered && (op == OpReset || op == OpRelease || op == OpRenew):
		return fmt.Errorf("%w: %s takes no evaluation id: repeating it is harmless", ErrInvalidRequest, op.named())
	}
	if hold != 0 || op == OpHold {
		if err := checkHold(op, policies, hold, remembered); err != nil {
			return err
		}
	}
	leases := 0
	for i := range policies {
		p := &policies[i]
		if p.Kind == KindConcurrency {
			leases++
		}
		if err := checkPolicy(op, p, cost); err != nil {
			return err
		}
		if err := checkReserve(op, p, cost); err != nil {
			return err
		}
	}
	if op == OpAcquire && leases == 0 {
		return fmt.Errorf("%w: acquire names no concurrency policy: spend instead", ErrInvalidRequest)
	}
	return nil
}

// checkHold reports whether op may be held for hold µs on policies, with
// an evaluation id when remembered is set: only OpHold is held, for 1µs
// or more; it names one policy of an algorithm that can cover a block used over the
// hold, with no evaluation id (a replay would hand out the block twice),
// and holds for at most a window and, for the bucket algorithms, at most
// the time the rate takes to refill Burst (GCRA.Decide's floor must fit
// in the bucket; it also keeps hold·Limit below 2^53).
func checkHold(op Op, policies []Policy, hold int64, remembered bool) error {
	switch {
	case op != OpHold:
		return fmt.Errorf("%w: hold = %dµs: only a held spend (%v) is held, not %s", ErrInvalidRequest, hold, OpHold, op.named())
	case hold < 1:
		return fmt.Errorf("%w: hold = %dµs: a held spend holds for 1µs or more", ErrInvalidRequest, hold)
	case len(policies) != 1:
		return fmt.Errorf("%w: hold = %dµs: a held spend names exactly one policy, not %d", ErrInvalidRequest, hold, len(policies))
	case remembered:
		return fmt.Errorf("%w: hold = %dµs: a held spend takes no evaluation id", ErrInvalidRequest, hold)
	}
	p := &policies[0]
	switch p.Kind {
	case KindSlidingWindow:
		return fmt.Errorf("policy %q: %w: hold = %dµs: sliding_window takes no held spend: its estimate weighs a unit by when it was spent, and a block's units are spent over the hold", p.ID, ErrInvalidRequest, hold)
	case KindSlidingLog:
		return fmt.Errorf("policy %q: %w: hold = %dµs: sliding_log takes no held spend: a block's entries would have to be dated ahead of the log's newest write", p.ID, ErrInvalidRequest, hold)
	case KindConcurrency:
		return fmt.Errorf("policy %q: %w: hold = %dµs: concurrency takes no held spend: a lease is taken by acquire", p.ID, ErrInvalidRequest, hold)
	case KindFixedPeriod:
		return fmt.Errorf("policy %q: %w: hold = %dµs: a calendar period takes no held spend (local quota)", p.ID, ErrInvalidRequest, hold)
	}
	if hold > p.Params.Window {
		return fmt.Errorf("policy %q: %w: hold = %dµs: must be at most the window, %dµs", p.ID, ErrInvalidRequest, hold, p.Params.Window)
	}
	if p.Kind == KindTokenBucket || p.Kind == KindGCRA {
		// hold·Limit ≤ Burst·Window, without the product (it may pass 2^63).
		if most := p.Params.Burst * p.Params.Window / p.Params.Limit; hold > most {
			return fmt.Errorf("policy %q: %w: hold = %dµs: must be at most the time the rate takes to refill the burst, %dµs", p.ID, ErrInvalidRequest, hold, most)
		}
	}
	return nil
}

// checkPolicy reports whether op may name p with cost.
func checkPolicy(op Op, p *Policy, cost int64) error {
	conc := p.Kind == KindConcurrency
	switch {
	case conc && op == OpSpend:
		return fmt.Errorf("policy %q: %w: spend on concurrency: a lease is taken by acquire", p.ID, ErrInvalidRequest)
	case conc && op == OpRefund:
		return fmt.Errorf("policy %q: %w by concurrency: release the lease instead", p.ID, ErrNotRefundable)
	case !conc && (op == OpRelease || op == OpRenew):
		return fmt.Errorf("policy %q: %w: %v on %v: only a concurrency policy holds leases", p.ID, ErrInvalidRequest, op, p.Kind)
	case op == OpRefund && p.Kind == KindSlidingWindow:
		return fmt.Errorf("policy %q: %w by sliding_window: after its window rolls over a unit is only a share of an estimate", p.ID, ErrNotRefundable)
	case !conc && op.spends() && cost > p.MaxCost:
		return fmt.Errorf("policy %q: cost = %d: %w %d", p.ID, cost, ErrCostTooHigh, p.MaxCost)
	}
	return nil
}

// Admits reports whether o asks for admission, the operations a priority
// class (Params.Reserve) applies to: a spend, a peek (judged as a spend),
// an acquisition, a renewal (which acquires afresh a lease no longer
// held) and an estimate (spent as a spend). What gives back (a refund, a
// release, a settle) or clears (a reset) is never denied, and a held
// spend (local quota's block) serves requests of any class later.
func (o Op) Admits() bool {
	return o == OpSpend || o == OpPeek || o == OpAcquire || o == OpRenew || o == OpEstimate || o == OpBook
}

// checkReserve reports whether op may name p with cost under p's Reserve
// (its priority class's share): only an admission carries one, less than
// the capacity, and a cost no larger than what the class may ever use.
func checkReserve(op Op, p *Policy, cost int64) error {
	r := int64(p.Params.Reserve)
	if r == 0 {
		return nil
	}
	most := p.Params.Capacity(p.Kind) - r
	switch {
	case r < 0 || most < 1:
		return fmt.Errorf("policy %q: %w: reserve = %d: must be 0 to capacity − 1, %d", p.ID, ErrInvalidRequest, r, p.Params.Capacity(p.Kind)-1)
	case !op.Admits():
		return fmt.Errorf("policy %q: %w: reserve = %d: %s takes no priority class, only an admission does", p.ID, ErrInvalidRequest, r, op.named())
	case p.Kind != KindConcurrency && cost > most:
		return fmt.Errorf("policy %q: cost = %d: %w %d for this priority class (%d of %d reserved for more important traffic)", p.ID, cost, ErrCostTooHigh, most, r, p.Params.Capacity(p.Kind))
	}
	return nil
}

// RecordID returns the key under which a store remembers the decision for
// evaluation id taken by op: spends (and acquisitions), refunds,
// estimates and settles apart, nothing else ever ("").
func RecordID(id string, op Op) string {
	switch {
	case id == "":
		return ""
	case op == OpSpend || op == OpAcquire || op == OpHold:
		return "s:" + id
	case op == OpRefund:
		return "r:" + id
	case op == OpEstimate:
		return "e:" + id
	case op == OpSettle:
		return "t:" + id
	}
	return ""
}
