package sluice

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the spans a Limiter records.
const tracerName = "github.com/sluicehq/sluice"

// The attributes of a recorded decision. None names a subject, a
// pseudonym, a lease or an evaluation id.
var (
	attrPolicy     = attribute.Key("sluice.policy")           // the policy IDs, in request order
	attrAlgorithm  = attribute.Key("sluice.algorithm")        // each policy's algorithm, in the same order
	attrOperation  = attribute.Key("sluice.operation")        // spend, peek, refund, …
	attrOutcome    = attribute.Key("sluice.outcome")          // allowed, denied, unavailable, …
	attrCause      = attribute.Key("sluice.cause")            // why unavailable: circuit_open, …
	attrReplayed   = attribute.Key("sluice.replayed")         // a remembered decision: nothing spent
	attrRetryAfter = attribute.Key("sluice.retry_after_ms")   // a denial's wait
	attrStore      = attribute.Key("sluice.store")            // the store's package: memstore, redisstore, …
	attrBatch      = attribute.Key("sluice.store.batch")      // decisions in the store's round trip (Evaluation.Batch)
	attrLatency    = attribute.Key("sluice.store.latency_us") // how long the store took to decide
)

// tracer is the tracing stage of a Limiter with a TracerProvider, the
// last before the store. A decision whose context holds a recording span
// (the caller's request) is an event on that span, which costs less than
// a span of its own (BENCHMARKS.md, "Tracing") and shows the same; a
// decision with no recording span to join (a context with no span, or
// only a remote parent's) is a span of its own, "sluice.Check". A
// Limiter without a TracerProvider has no such stage: tracing off costs
// nothing.
type tracer struct {
	tracer trace.Tracer
	start  []trace.SpanStartOption
	kind   attribute.KeyValue // sluice.store
	clock  Clock              // the Limiter's: times the store
}

func newTracer(tp trace.TracerProvider, store Store, c Clock) *tracer {
	for range 8 { // wrappers with an Unwrap() Store method, bounded: one could unwrap to itself
		w, ok := store.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		store = w.Unwrap()
	}
	return &tracer{
		tracer: tp.Tracer(tracerName),
		start:  []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)},
		kind:   attrStore.String(storeKind(store)),
		clock:  c,
	}
}

// storeKind names a store by its package, e.g. "redisstore" for a
// *redisstore.Store.
func storeKind(store any) string {
	t := strings.TrimLeft(fmt.Sprintf("%T", store), "*")
	if i := strings.LastIndexByte(t, '.'); i >= 0 {
		t = t[:i]
	}
	return t
}

// do is the tracing stage: next asks the store for d.ev's decision, and
// the Outcome it maps to is recorded.
func (t *tracer) do(ctx context.Context, d *decision, next step) {
	ctx, span, own, sampled := t.begin(ctx)
	if own {
		defer span.End()
	}
	if !sampled { // nothing to time or record
		next(ctx, d)
		return
	}
	t0 := t.clock.Now()
	next(ctx, d)
	t.record(span, own, d, t.clock.Now().Sub(t0).Microseconds())
}

// begin returns the span a decision under ctx is recorded on, with the
// context to decide under: the recording span of ctx (own false), or a
// new span of the decision's own (own true: the caller ends it).
// sampled is false when the new span records nothing: then there is
// nothing to time or record.
func (t *tracer) begin(ctx context.Context) (_ context.Context, span trace.Span, own, sampled bool) {
	if span = trace.SpanFromContext(ctx); span.IsRecording() {
		return ctx, span, false, true
	}
	ctx, span = t.tracer.Start(ctx, "sluice.Check", t.start...)
	return ctx, span, true, span.IsRecording()
}

// record puts d's decision, which the store took in tookUS µs, on span:
// as an event, or as the attributes (and status) of the decision's own
// span.
func (t *tracer) record(span trace.Span, own bool, d *decision, tookUS int64) {
	ev, o := &d.ev, &d.o
	attrs := make([]attribute.KeyValue, 0, 10)
	if len(ev.Policies) == 1 {
		attrs = append(attrs, attrPolicy.String(ev.Policies[0].ID), attrAlgorithm.String(ev.Policies[0].Algorithm.String()))
	} else {
		ids, algs := make([]string, len(ev.Policies)), make([]string, len(ev.Policies))
		for i, p := range ev.Policies {
			ids[i], algs[i] = p.ID, p.Algorithm.String()
		}
		attrs = append(attrs, attrPolicy.StringSlice(ids), attrAlgorithm.StringSlice(algs))
	}
	attrs = append(attrs, attrOperation.String(ev.Op.String()), attrOutcome.String(o.Kind.String()), t.kind, attrLatency.Int64(tookUS))
	if o.Cause != 0 {
		attrs = append(attrs, attrCause.String(o.Cause.String()))
	}
	if o.Kind == Denied {
		attrs = append(attrs, attrRetryAfter.Int64(o.RetryAfter.Milliseconds()))
	}
	if o.Replayed {
		attrs = append(attrs, attrReplayed.Bool(true))
	}
	if ev.Batch > 0 {
		attrs = append(attrs, attrBatch.Int(ev.Batch))
	}
	if !own {
		span.AddEvent("sluice.decision", trace.WithAttributes(attrs...))
		return
	}
	span.SetAttributes(attrs...)
	if o.Kind == Unavailable || o.Kind == Indeterminate {
		desc := o.Kind.String()
		if o.Cause != 0 {
			desc += ": " + o.Cause.String()
		}
		span.SetStatus(codes.Error, desc)
	}
}
