package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// Kind is what became of a request. Its String form is the JSON spelling.
type Kind uint8

// Outcome kinds: two decisions, and three ways of not deciding.
const (
	// Allowed: the cost was spent.
	Allowed Kind = iota + 1
	// Denied: the limit is reached; nothing was spent.
	Denied
	// Incompatible: the request cannot be decided as asked (unknown policy,
	// cost above max, invalid subject). Retrying will not help.
	Incompatible
	// Unavailable: no decision was taken and nothing was spent; Cause says
	// why.
	Unavailable
	// Indeterminate: the decision may have been taken (and the cost spent)
	// but its answer was lost. Do not assume nothing was spent; retry with
	// the same EvaluationID where the store deduplicates.
	Indeterminate
)

var kindNames = [...]string{Allowed: "allowed", Denied: "denied", Incompatible: "incompatible", Unavailable: "unavailable", Indeterminate: "indeterminate"}

// String returns the JSON spelling, e.g. "denied".
func (k Kind) String() string {
	if k >= Allowed && k <= Indeterminate {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Cause says why an outcome is Unavailable.
type Cause uint8

// Causes of Unavailable. The zero value means "none".
const (
	// DeadlinePassed: the context was done before anything was sent.
	DeadlinePassed Cause = iota + 1
	// FailedBeforeSend: the store failed before the request was written
	// (connection refused, pool exhausted); nothing was spent.
	FailedBeforeSend
	// ClockUnsafe: the caller's clock is further behind the stored state
	// than the store allows; nothing was spent.
	ClockUnsafe
	// CircuitOpen: the store is known to be failing and was not asked.
	CircuitOpen
	// CorruptState: the store holds state for the subject that it could
	// not have written; nothing was spent. A server fault, not the
	// request's: clear it with a reset (Request.Reset).
	CorruptState
)

var causeNames = [...]string{DeadlinePassed: "deadline_passed", FailedBeforeSend: "failed_before_send", ClockUnsafe: "clock_unsafe", CircuitOpen: "circuit_open", CorruptState: "corrupt_state"}

// String returns the metric and log spelling, e.g. "clock_unsafe"; "" for
// no cause.
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return fmt.Sprintf("Cause(%d)", uint8(c))
}

var causeErrors = [...]string{DeadlinePassed: "deadline passed", FailedBeforeSend: "store failed before send", ClockUnsafe: "clock unsafe", CircuitOpen: "circuit open", CorruptState: "corrupt limiter state"}

// Error returns the cause in words, e.g. "circuit open". A Cause is also
// the error a Store wraps to say why it could not decide, matched with
// errors.Is: fmt.Errorf("mystore: …: %w", sluice.CircuitOpen).
func (c Cause) Error() string {
	if c >= DeadlinePassed && c <= CorruptState {
		return causeErrors[c]
	}
	return c.String()
}

// Errors a Store wraps, matched with errors.Is: ErrInvalidRequest for a
// request that breaks an operation's rules (Incompatible, as is a cost
// above the policy's MaxCost, a refund the algorithm cannot take and an
// unknown policy: the Kind says so, the message names the rule),
// ErrIndeterminate for an answer lost after it was sent (Indeterminate).
// A Store says why it could not decide with a Cause.
var (
	ErrInvalidRequest = algorithm.ErrInvalidRequest         // Incompatible
	ErrIndeterminate  = errors.New("reply lost after send") // Indeterminate
)

// Status is the verdict of one policy.
type Status struct {
	// Policy is the policy ID, e.g. "login".
	Policy string
	// Allowed reports whether this policy admits the cost. In a denied
	// multi-policy request a policy may admit while another denies; then
	// nothing was spent on it either.
	Allowed bool
	// Limit is the most Remaining can be: the policy's Limit, or its Burst
	// for token_bucket and gcra. Example: 3 for "3 per 10s".
	Limit int64
	// Remaining is how many units could still be admitted right now.
	// Example: after the second of "3 per 10s", 1. Never negative.
	Remaining int64
	// ResetAfter is how long until Remaining is back to Limit if nothing
	// more is spent. Example: 10s right after the first of "3 per 10s".
	ResetAfter time.Duration
	// RetryAfter is how long until the same cost would be admitted; 0 when
	// Allowed. Example: 7.5s for the fourth of "3 per 10s" sent 2.5s after
	// the first.
	RetryAfter time.Duration
	// Approximate reports that the verdict is an estimate (sliding_window).
	Approximate bool
	// Delay is how long an Allowed Book waits for the slot it booked; 0
	// when it was admitted now, and for every other operation. Example:
	// 15ms for the third of three waiters booked at once on gcra 200/s,
	// burst 1.
	Delay time.Duration
	// Charged, GivenBack and Owed say what a Settle did, in units (0 for
	// every other operation): the part of the actual cost beyond the
	// estimate that was charged (past the limit if need be), the part of
	// the estimate beyond the actual cost that was given back, and how
	// far past its capacity the policy is left, to be paid off before it
	// admits again. Example: an estimate of 100 settled at 130 on a
	// token_bucket with 10 left: Charged 30, GivenBack 0, Owed 20.
	Charged, GivenBack, Owed int64
}

// Outcome is the typed answer to a Request. It is a value, never a panic:
// even a failing store yields an Outcome with Kind and Err set.
type Outcome struct {
	// Kind is what became of the request.
	Kind Kind
	// Status is the verdict of the most restrictive policy: for a denial,
	// the denying policy with the longest RetryAfter; otherwise the policy
	// with the fewest Remaining. Zero when no store decision was taken.
	Status
	// Statuses holds one Status per policy, in the order of
	// Request.Policies, when the request named several; nil otherwise.
	Statuses []Status
	// Lease is the lease an Allowed spend acquired on the request's
	// Concurrency policies, to give back with a Check of Op Release (and
	// keep with one of Op Renew); the zero Lease when it named none. Example:
	// {ID: "q3Xh0bV8Yx2lC0mQe1o7bA", Subject: "u:42", Policies: ["reports"]}.
	Lease Lease
	// Replayed reports that this is the remembered first decision for the
	// request's EvaluationID: nothing was spent this time.
	Replayed bool
	// FromCache reports that the Limiter answered this denial from its
	// near cache (Policy.NearCache), without asking the store.
	FromCache bool
	// Local reports that the Limiter admitted this request from a block of
	// local quota (Policy.LocalQuota) without asking the store. Status is
	// then the store's when the block was taken, with the units still in
	// the block added to Remaining.
	Local bool
	// Cause says why the outcome is Unavailable; zero otherwise.
	Cause Cause
	// Err is the error behind Incompatible, Unavailable and Indeterminate,
	// and behind a Denied that Limiter.Wait answers (which bound the slot
	// lay past); nil otherwise. Match it with errors.Is against the Err…
	// variables, the Causes and context.DeadlineExceeded.
	Err error
}

// Lease is a slot held on one or more Concurrency policies, from an
// Allowed Check until a Check of Op Release gives it back, or until the
// policy's LeaseTTL passes without a renewal (so a holder that dies
// cannot leak a slot for longer than that). The zero value holds nothing;
// releasing it does nothing.
//
// The usual shape:
//
//	o := lim.Check(ctx, req)
//	if o.Kind != sluice.Allowed { … }
//	defer lim.Check(context.WithoutCancel(ctx), sluice.Request{Op: sluice.Release,
//		Policies: o.Lease.Policies, Subject: o.Lease.Subject, LeaseID: o.Lease.ID})
type Lease struct {
	// ID names the lease: 22 characters of base64url, random (or, for a
	// request with an EvaluationID, derived from it and the subject, so a
	// replayed decision names the lease the first one acquired). It never
	// contains the subject. Example: "q3Xh0bV8Yx2lC0mQe1o7bA".
	ID string
	// Subject is the subject the lease is held for.
	Subject string
	// Policies are the IDs of the Concurrency policies it is held on, in
	// the order of the request that acquired it.
	Policies []string
}
