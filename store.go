package sluice

import (
	"context"
	"time"
)

// Store takes decisions atomically. A decision covers one subject and one or
// more policies: either every policy admits the cost and it is spent on all
// of them, or nothing is spent.
//
// Implementations must be safe for concurrent use, must not modify the
// Policies they are handed, and must report failures with errors that
// wrap what Limiter types the outcome by: the Cause of a decision not
// taken (FailedBeforeSend, ClockUnsafe, CircuitOpen, CorruptState; a bare
// context error when the context ended before anything was sent),
// ErrIndeterminate for an answer lost after sending, and the Incompatible
// errors (ErrInvalidRequest, ErrCostTooHigh, ErrNotRefundable) of a
// request that breaks an operation's rules. The package sluicetest holds
// the behavioural suite every Store must pass.
type Store interface {
	Evaluate(ctx context.Context, ev *Evaluation) error
}

// Evaluation is one decision handed to a Store: one operation for one
// subject over one or more policies. Limiter has validated what only it
// knows: the policies are its own, valid, with defaults applied; Subject,
// Previous, EvaluationID and LeaseID are well-formed. The operation's own
// rules (which policies it may name, what cost it takes, what it carries)
// are the store's to check, through the decision engine, before it reads
// or writes any state: for a decision that breaks one it writes nothing
// and returns an error wrapping ErrInvalidRequest, ErrCostTooHigh or
// ErrNotRefundable.
type Evaluation struct {
	// Op is what the decision does. Example: Refund.
	Op Op
	// Subject is the pseudonymous subject the state belongs to.
	Subject string
	// Policies are the policies to evaluate, in request order.
	Policies []*Policy
	// Cost is the number of units to spend (Spend, and the rate policies
	// of an Acquire) or give back (Refund), at least 1; 0 for every other
	// operation.
	Cost int64
	// LeaseID is the lease an Acquire takes on every Concurrency policy it
	// names, or the one a Release gives back or a Renew extends; "" for
	// the other operations. Example: "q3Xh0bV8Yx2lC0mQe1o7bA".
	LeaseID string
	// EvaluationID, when set, identifies the request across retries: the
	// store remembers the decision of a Spend, Acquire or Refund for the
	// first policy's DedupeTTL (at most DedupeMax ids per subject and
	// policy, oldest forgotten first), written atomically with the
	// decision, and answers a repeat with the remembered statuses and
	// Replayed set, spending nothing. Spends and refunds with the same id
	// are remembered separately; a Peek's id is never remembered; Reset,
	// Release and Renew take none.
	EvaluationID string
	// Previous are older subjects of the same caller, newest first (a key
	// rotation): for a policy with no live state under Subject, the store
	// copies the state kept under the first of them that has one to
	// Subject, whatever the verdict, and decides on it; a Reset clears the
	// state under each of them too. The copy is not atomic with changes
	// made under the older subject meanwhile.
	Previous []string
	// Hold, when above 0, makes a Spend of one token_bucket, gcra or
	// fixed_window policy, with no EvaluationID, a block of local quota
	// (Policy.LocalQuota): the Limiter admits its Cost units itself, one
	// request at a time, over the next Hold, and the store spends them so
	// that they cover every such admission. The bucket algorithms first
	// hold back what the rate would refill during Hold (the level is taken
	// as at most a full bucket less that refill; GCRA: the TAT as at least
	// now + Hold), then spend Cost at now, as any spend: a unit the Limiter
	// admits late in the hold was not refilled meanwhile for anyone else.
	// A held spend that does not fit is denied, its Remaining the largest
	// block this Hold could take now. fixed_window spends as usual: the
	// Limiter ends the block by the window's end, which the admitted
	// Status's ResetAfter tells. The hold runs from the store's now: a
	// Limiter that counts it from before it sends the spend ends it no
	// later. A whole number of µs, at most Window, and for the bucket
	// algorithms at most the time the rate takes to refill Burst
	// (Burst × Window / Limit); 0 for every other decision. Example: 100ms.
	Hold time.Duration
	// Replayed is set by the store when Statuses are a remembered decision.
	Replayed bool
	// Statuses receives one Status per policy, in order. The store
	// overwrites it (reusing its capacity): Statuses = append(Statuses[:0], …).
	Statuses []Status
	// Batch is set by a store that shares round trips between decisions:
	// how many decisions the round trip that carried this one held, this
	// one included (1 when it went alone). It is recorded in a trace
	// (Options.TracerProvider); 0 when the store does not say. Example: 12.
	Batch int
}

// Clock tells the time. Nothing below Limiter reads the time by other
// means. A nil Clock in a store's options means the real one; tests hand
// in a fake one (sluicetest.Clock).
type Clock interface {
	Now() time.Time
}
