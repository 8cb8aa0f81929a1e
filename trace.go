package sluice

import (
	"context"

	"github.com/sluicehq/sluice/internal/tracing"
	"go.opentelemetry.io/otel/trace"
)

// tracer is the tracing stage of a Limiter with a TracerProvider, the
// last before the store: it records each decision asked of the store
// through internal/tracing (a span of its own, or an event on the
// caller's). A Limiter without a TracerProvider has no such stage:
// tracing off costs nothing.
type tracer struct {
	t     *tracing.Tracer
	clock Clock // the Limiter's: times the store
}

func newTracer(tp trace.TracerProvider, store Store, c Clock) *tracer {
	for range 8 { // wrappers with an Unwrap() Store method, bounded: one could unwrap to itself
		w, ok := store.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		store = w.Unwrap()
	}
	return &tracer{t: tracing.New(tp, tracing.StoreKind(store)), clock: c}
}

// do is the tracing stage: next asks the store for d.ev's decision, and
// the Outcome it maps to is recorded.
func (t *tracer) do(ctx context.Context, d *decision, next step) {
	ctx, span, own, sampled := t.t.Start(ctx)
	if own {
		defer span.End()
	}
	if !sampled { // nothing to time or record
		next(ctx, d)
		return
	}
	t0 := t.clock.Now()
	next(ctx, d)
	ev, o := &d.ev, &d.o
	r := tracing.Decision{Op: ev.Op.String(), Outcome: o.Kind.String(), Denied: o.Kind == Denied, Failed: o.Kind == Unavailable || o.Kind == Indeterminate,
		RetryAfter: o.RetryAfter, Replayed: o.Replayed, Batch: ev.Batch, Took: t.clock.Now().Sub(t0)}
	if len(ev.Policies) == 1 {
		r.Policy, r.Algorithm = ev.Policies[0].ID, ev.Policies[0].Algorithm.String()
	} else {
		for _, p := range ev.Policies {
			r.Policies, r.Algorithms = append(r.Policies, p.ID), append(r.Algorithms, p.Algorithm.String())
		}
	}
	if o.Cause != 0 {
		r.Cause = o.Cause.String()
	}
	t.t.Record(span, own, &r)
}
