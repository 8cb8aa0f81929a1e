package sluice

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policyerr"
)

// A stage is one step of a Limiter's Check between validation and the
// store: it sees the decision in flight and calls next to take it further
// (once, more than once, or not at all when it answers itself), and may
// read what next left in d.o on the way back. Each feature that acts on
// decisions is one stage in a file of its own, in the order Limiter.stages
// gives: overrides (the subject's own numbers), the near cache (a
// remembered denial), local quota (admit from a block, or send a held
// spend), tracing; the store is last. A new capability is a stage beside
// these, not a branch in Check.
type stage func(ctx context.Context, d *decision, next step)

// A step takes d from one point of the pipeline to its end.
type step func(ctx context.Context, d *decision)

// decision is one Check in flight: the Evaluation the store gets, and the
// Outcome it comes to. Pooled by the Limiter.
type decision struct {
	ev   Evaluation
	o    Outcome // set by the store step, or by a stage answering itself
	many bool    // the request named Policies: the Outcome carries Statuses
}

// chain returns the step that runs stages in order, then last.
func chain(stages []stage, last step) step {
	next := last
	for i := len(stages) - 1; i >= 0; i-- {
		s, n := stages[i], next
		next = func(ctx context.Context, d *decision) { s(ctx, d, n) }
	}
	return next
}

// evaluate is the last step: the store decides d.ev, and outcomeOf maps
// its answer to d.o.
func (l *Limiter) evaluate(ctx context.Context, d *decision) {
	err := l.store.Evaluate(ctx, &d.ev)
	outcomeOf(&d.o, &d.ev, err, d.many)
}

// outcomeOf is the one mapping of a store's answer to an Outcome, o:
// err, the error Evaluate returned, typed by failed; else the statuses it
// filled in ev, the most restrictive speaking for the whole. With many
// (the request named Policies) the Outcome carries every status. o is
// written field by field, in place: an Outcome built whole and then
// copied reads back what was just stored, which stalls some CPUs.
func outcomeOf(o *Outcome, ev *Evaluation, err error, many bool) {
	switch {
	case err != nil:
		*o = failed(err)
	case len(ev.Statuses) != len(ev.Policies):
		*o = Outcome{Kind: Incompatible, Err: fmt.Errorf("sluice: store answered %d statuses for %d policies", len(ev.Statuses), len(ev.Policies))}
	default:
		if len(ev.Statuses) == 1 {
			o.Status = ev.Statuses[0] // copied once, not through mostRestrictive's choice
		} else {
			o.Status = ev.Statuses[mostRestrictive(ev.Statuses)]
		}
		o.Kind, o.Replayed, o.Cause, o.Err, o.FromCache, o.Local = Allowed, ev.Replayed, 0, nil, false, false
		o.Lease, o.Statuses = Lease{}, nil
		if !o.Allowed {
			o.Kind = Denied
		} else if ev.Op == Acquire || ev.Op == Renew {
			o.Lease = leaseOf(ev)
		}
		if many {
			o.Statuses = append([]Status(nil), ev.Statuses...)
		}
	}
}

// failed types a store error, said in the library's words (said).
func failed(err error) Outcome {
	o := Outcome{Err: said(err)}
	switch {
	case errors.Is(err, ErrIndeterminate):
		// First: a lost reply may also wrap the context error that cut it off.
		o.Kind = Indeterminate
	case errors.Is(err, CorruptState):
		o.Kind, o.Cause = Unavailable, CorruptState
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, policyerr.ErrUnknownPolicy), errors.Is(err, algorithm.ErrCostTooHigh), errors.Is(err, algorithm.ErrNotRefundable):
		o.Kind = Incompatible
	case errors.Is(err, ClockUnsafe):
		o.Kind, o.Cause = Unavailable, ClockUnsafe
	case errors.Is(err, CircuitOpen):
		o.Kind, o.Cause = Unavailable, CircuitOpen
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// A store that honours the contract returns a bare context error
		// only when nothing was sent; otherwise it wraps ErrIndeterminate.
		o.Kind, o.Cause = Unavailable, DeadlinePassed
	case errors.Is(err, FailedBeforeSend):
		o.Kind, o.Cause = Unavailable, FailedBeforeSend
	default:
		// An error the store did not classify: it may have spent.
		o.Kind = Indeterminate
	}
	return o
}

// mostRestrictive returns the index of the Status of ss (at least one)
// that speaks for them all: the denial that lasts longest, else the
// policy closest to exhaustion and, of two as close, the one that resets
// later; of two alike, the first. It is the one choice: an Outcome's
// Status among its Statuses here, and through form.MostRestrictive the
// Envoy service's across the checks of one request.
func mostRestrictive(ss []Status) int {
	best := 0
	for i := 1; i < len(ss); i++ {
		b, s := &ss[best], &ss[i]
		switch {
		case b.Allowed && !s.Allowed:
			best = i
		case !b.Allowed && !s.Allowed && s.RetryAfter > b.RetryAfter:
			best = i
		case b.Allowed && s.Allowed && (s.Remaining < b.Remaining || s.Remaining == b.Remaining && s.ResetAfter > b.ResetAfter):
			best = i
		}
	}
	return best
}

// said returns a store's error as an Outcome says it. A Store wraps the
// engine's error behind its package's name (`memstore: %w`): said drops
// that name for the library's ("sluice: "), so that a refusal reads the
// same whichever store refused it (and a check API answer's reason names
// no store), and keeps the store's error underneath, for errors.Is,
// errors.As and Unwrap. Any other error is left as it is.
func said(err error) error {
	inner := errors.Unwrap(err)
	if inner == nil {
		return err
	}
	prefix, ok := strings.CutSuffix(err.Error(), inner.Error())
	name, named := strings.CutSuffix(prefix, ": ")
	if !ok || !named || name == "" || strings.ContainsAny(name, " :") || name == "sluice" {
		return err
	}
	return &storeError{msg: "sluice: " + inner.Error(), err: err}
}

// storeError is a store's error in the library's words (said).
type storeError struct {
	msg string
	err error
}

func (e *storeError) Error() string { return e.msg }
func (e *storeError) Unwrap() error { return e.err }
