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
	attrFromCache  = attribute.Key("sluice.from_cache")       // denied by the near cache, the store not asked
	attrRetryAfter = attribute.Key("sluice.retry_after_ms")   // a denial's wait
	attrStore      = attribute.Key("sluice.store")            // the store's package: memstore, redisstore, …
	attrBatch      = attribute.Key("sluice.store.batch")      // decisions in the store's round trip (Evaluation.Batch)
	attrLatency    = attribute.Key("sluice.store.latency_us") // how long the store took to decide
)

// tracing records a Limiter's decisions. A decision whose context holds a
// recording span (the caller's request) is an event on that span, which
// costs less than a span of its own (BENCHMARKS.md, "Tracing") and shows
// the same: a decision with no recording span to join (a context with no
// span, or only a remote parent's) is a span of its own, "sluice.Check".
type tracing struct {
	tracer trace.Tracer
	start  []trace.SpanStartOption
	store  attribute.KeyValue
}

func newTracing(tp trace.TracerProvider, store Store) *tracing {
	return &tracing{
		tracer: tp.Tracer(tracerName),
		start:  []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)},
		store:  attrStore.String(storeKind(store)),
	}
}

// storeKind names store by its package, e.g. "redisstore" for a
// *redisstore.Store, seen through wrappers that have an Unwrap() Store
// method.
func storeKind(store Store) string {
	for range 8 { // bounded: a wrapper could unwrap to itself
		w, ok := store.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		store = w.Unwrap()
	}
	t := strings.TrimLeft(fmt.Sprintf("%T", store), "*")
	if i := strings.LastIndexByte(t, '.'); i >= 0 {
		t = t[:i]
	}
	return t
}

// begin returns the context the decision runs in, the span that records
// it, and whether that span is the decision's own.
func (t *tracing) begin(ctx context.Context) (context.Context, trace.Span, bool) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		return ctx, span, false
	}
	ctx, span := t.tracer.Start(ctx, "sluice.Check", t.start...)
	return ctx, span, true
}

// traceEnd records the decision o of req on span, as an event unless the
// span is the decision's own: ev holds the policies and what the store
// said of its round trip.
func (l *Limiter) traceEnd(span trace.Span, own bool, req *Request, ev *Evaluation, o *Outcome) {
	if !span.IsRecording() {
		if own {
			span.End()
		}
		return
	}
	if len(ev.Policies) == 0 {
		l.lookup(ev, req) // decided before the lookup (a deadline): the policies of l it names
	}
	attrs := make([]attribute.KeyValue, 0, 11)
	if len(ev.Policies) == 1 {
		p := ev.Policies[0]
		attrs = append(attrs, attrPolicy.String(p.ID), attrAlgorithm.String(p.Algorithm.String()))
	} else {
		policies := make([]string, len(ev.Policies))
		algorithms := make([]string, len(ev.Policies))
		for i, p := range ev.Policies {
			policies[i], algorithms[i] = p.ID, p.Algorithm.String()
		}
		attrs = append(attrs, attrPolicy.StringSlice(policies), attrAlgorithm.StringSlice(algorithms))
	}
	attrs = append(attrs, attrOperation.String(req.Op.String()), attrOutcome.String(o.Kind.String()), l.tracing.store)
	if o.Cause != 0 {
		attrs = append(attrs, attrCause.String(o.Cause.String()))
	}
	if o.Kind == Denied {
		attrs = append(attrs, attrRetryAfter.Int64(o.RetryAfter.Milliseconds()))
	}
	if o.Replayed {
		attrs = append(attrs, attrReplayed.Bool(true))
	}
	if o.FromCache {
		attrs = append(attrs, attrFromCache.Bool(true))
	}
	if ev.Batch > 0 {
		attrs = append(attrs, attrBatch.Int(ev.Batch))
	}
	if ev.asked {
		attrs = append(attrs, attrLatency.Int64(ev.storeTime.Microseconds()))
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
	span.End()
}
