package httplimit

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
)

// errNothingSpent is the error of a Refund for a request that spent
// nothing: it was not limited, was denied, passed while the limiter could
// not decide, or was refunded already.
var errNothingSpent = fmt.Errorf("httplimit: the request spent nothing to refund: %w", sluice.ErrInvalidRequest)

// stateKey keys the request's *state in its context.
type stateKey struct{}

// state is what the middleware leaves in the context of a request it
// limited: the decision, and what Refund needs to give the cost back.
type state struct {
	d        Decision
	m        *Middleware
	rt       *route
	refunded atomic.Bool
}

// FromContext returns the Decision the middleware took for the request
// whose context is ctx, for the handler behind the middleware and for
// Options.Deny. It reports false for a request no route limited.
func FromContext(ctx context.Context) (Decision, bool) {
	st, ok := ctx.Value(stateKey{}).(*state)
	if !ok {
		return Decision{}, false
	}
	return st.d, true
}

// Refund gives back the units the middleware spent for the request whose
// context is ctx, for work that was admitted but not done (the handler
// failed before doing it, the upstream call was never made). The caller
// needs nothing but the context: the subject's pseudonym, the policies
// and the cost are the middleware's. Only the first Refund of a request
// gives units back; with an idempotency key (Options.IdempotencyKeyHeader)
// a retried request's refund is not given twice either.
//
// The answer is the Limiter's outcome: Allowed with the numbers after the
// refund; Incompatible with an Err matching sluice.ErrInvalidRequest for a
// request that spent nothing (or was refunded already); Incompatible,
// the message saying so, for a policy whose algorithm cannot give units
// back (sliding_window). A route's concurrency policies are left alone:
// their lease is released when the handler returns. The refund gets the
// middleware's deadline of its own, so it also runs when the request's
// context is already canceled.
func Refund(ctx context.Context) sluice.Outcome {
	st, ok := ctx.Value(stateKey{}).(*state)
	if !ok {
		return sluice.Outcome{Kind: sluice.Incompatible, Err: errNothingSpent}
	}
	if st.d.Action != actionAdmitted {
		// Denied, failed or unidentified (in shadow mode too): nothing
		// was spent.
		return sluice.Outcome{Kind: sluice.Incompatible, Err: errNothingSpent}
	}
	if !st.refunded.CompareAndSwap(false, true) {
		return sluice.Outcome{Kind: sluice.Incompatible, Err: errNothingSpent}
	}
	o := st.m.core.Refund(ctx, st.rt.Rule, &edge.Action{Kind: edge.Admit, Local: st.d.Local}, st.d.subject())
	if o.Kind != sluice.Allowed {
		// Nothing was given back (or it is unknown whether): a later
		// Refund may try again, with the same evaluation ID if any.
		st.refunded.Store(false)
	}
	return o
}
