package sluice

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// store.go is the contract a Store implements. It depends on policy.go
// and outcome.go only; the Limiter (limiter.go) and its stages are above
// it.

// Op is what a Request does. Its String form is the check API's spelling.
type Op uint8

// The operations. The zero value is Spend.
const (
	// Spend spends Cost units of every named policy, all of them rate
	// policies: all or nothing.
	Spend = Op(algorithm.OpSpend) // spend
	// Peek reports the state without spending: the verdict is the one a
	// cost of 1 would get. Cost must be 0.
	Peek = Op(algorithm.OpPeek) // peek
	// Refund gives Cost units back to every named policy, for work that
	// was admitted but never done, never raising Remaining above Limit.
	// A sliding_window or concurrency policy makes the request
	// Incompatible.
	Refund = Op(algorithm.OpRefund) // refund
	// Reset clears the subject's state of every named policy, as if the
	// subject had never been seen: the way to unlock a user locked out by
	// a login limit. Cost must be 0 and EvaluationID empty. The Outcome is
	// Allowed, with the statuses of fresh state. Remembered evaluation ids
	// are kept, so a retry of a decision taken before the reset is still
	// answered, not spent again.
	Reset = Op(algorithm.OpReset) // reset
	// Acquire takes one lease on every named Concurrency policy (at least
	// one) and spends Cost units of the rate policies named beside them,
	// all or nothing: Outcome.Lease, to give back with a Release.
	// The Limiter names the lease unless LeaseID does.
	Acquire = Op(algorithm.OpAcquire) // acquire
	// Release gives the lease LeaseID back on every named policy, all of
	// them Concurrency policies, atomically. It is idempotent: releasing
	// a lease twice, after it expired, or that was never acquired is
	// Allowed all the same. A Release of the zero Lease (no LeaseID,
	// Subject or policy) is Allowed without asking the store, so
	// deferring one is safe on any outcome; pass it a context that
	// outlives the request (context.WithoutCancel), or the slot is held
	// until the lease expires.
	Release = Op(algorithm.OpRelease) // release
	// Renew extends the lease LeaseID on every named policy by its
	// LeaseTTL from now; one no longer held is taken again if there is
	// room, else Denied.
	Renew = Op(algorithm.OpRenew) // renew
	// Estimate spends Cost units of every named policy exactly as a
	// Spend, for work whose cost is known only once it is done, and the
	// store remembers it under EvaluationID (required) until the first
	// policy's DedupeTTL, its deadline. fixed_window, sliding_log,
	// token_bucket and gcra policies only (see Settle).
	Estimate = Op(algorithm.OpEstimate) // estimate
	// Settle replaces the Estimate spent under the same EvaluationID with
	// the actual cost, Cost (0 included), in one decision: the difference
	// is given back, or the excess charged even past the limit (a bucket
	// carries the debt into the time after; a fixed window or calendar
	// period counts it in the one open now, gives back only into the
	// estimate's while open; a sliding log likewise), reported by
	// Status.Charged, GivenBack and Owed. Never denied; a retry answers
	// the same and changes nothing. An Estimate never settled stays spent.
	// A sliding_window or concurrency policy makes either Incompatible:
	// the first cannot give back exactly, the second counts leases.
	Settle = Op(algorithm.OpSettle) // settle
	// Book spends Cost units of one gcra or token_bucket policy now when
	// they fit, and otherwise books the earliest time they will, in the
	// same atomic decision: Allowed with Status.Delay, the wait until that
	// slot, when it is at most MaxWait (the policy's, or Request.MaxWait
	// when less); beyond, Denied as a Spend is, booking nothing. Waiters
	// in any number of processes are so spaced at the rate without
	// polling. Limiter.Wait sleeps until the slot; Limiter.Reserve returns
	// it with a way to give it back. No EvaluationID; other algorithms are
	// Incompatible (a window or a log has no future slot to book: see
	// docs/wait.md).
	Book = Op(algorithm.OpBook) // book
)

// String returns the check API's spelling, e.g. "refund".
func (o Op) String() string { return algorithm.Op(o).String() }

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
// error ErrInvalidRequest of a
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
// and returns an error wrapping ErrInvalidRequest (the decision engine's
// own errors for a cost above MaxCost and a refund the algorithm cannot
// take are Incompatible too).
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
	// Priority is the request's priority class (Request.Priority): for an
	// admission (Spend, Peek, Acquire, Renew, Estimate, Book; not a held spend)
	// each policy is decided as if its capacity (Limit, Burst for
	// token_bucket and gcra) were the class's ceiling, ⌊capacity × share /
	// 100⌋ and at least 1 (Policy.Priorities), on the same state: a window
	// admits while the units used after the request stay within it, a
	// bucket while it keeps the rest; Remaining is the class's. "" is the
	// class "default"; a class a policy does not name uses its whole
	// capacity. sluicetest.TestStore holds a store to it. Example:
	// "sheddable".
	Priority string
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
	// MaxWait is a Book's bound: the longest it may wait for its slot (a
	// Limiter sends its policy's MaxWait, or the request's when less), a
	// whole number of µs, at most 24h (and what keeps the units booked
	// ahead exact: algorithm.MostWait); 0 for every other operation (and
	// a Book that may only be admitted now). Example: 500ms.
	MaxWait time.Duration
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

	// short records that the Limiter's validation found the decision in
	// the short form (shortForm, limiter.go): a store may take its short
	// course on it, and reads this through evaluation.Short, never
	// deriving the form again. False, the general form, for an Evaluation
	// built by other means.
	short bool
}

// Clock tells the time. Nothing below Limiter reads the time by other
// means. A nil Clock in a store's options means the real one; tests hand
// in a fake one (sluicetest.Clock).
type Clock interface {
	Now() time.Time
}
