// Package tracing records a Limiter's decisions through the
// OpenTelemetry API for the root's tracing stage (sluice's trace.go,
// Options.TracerProvider): the spans and events, and their attributes.
// It knows nothing of the Limiter's types: the stage hands it a Decision
// in words and numbers.
package tracing

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of the spans a Limiter records.
const Name = "github.com/sluicehq/sluice"

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

// Tracer records decisions asked of one store. A decision whose context
// holds a recording span (the caller's request) is an event on that
// span, which costs less than a span of its own (BENCHMARKS.md,
// "Tracing") and shows the same; a decision with no recording span to
// join (a context with no span, or only a remote parent's) is a span of
// its own, "sluice.Check".
type Tracer struct {
	tracer trace.Tracer
	start  []trace.SpanStartOption
	kind   attribute.KeyValue // sluice.store
}

// New returns a Tracer on tp for a store whose package is store (see
// StoreKind).
func New(tp trace.TracerProvider, store string) *Tracer {
	return &Tracer{
		tracer: tp.Tracer(Name),
		start:  []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)},
		kind:   attrStore.String(store),
	}
}

// StoreKind names a store by its package, e.g. "redisstore" for a
// *redisstore.Store.
func StoreKind(store any) string {
	t := strings.TrimLeft(fmt.Sprintf("%T", store), "*")
	if i := strings.LastIndexByte(t, '.'); i >= 0 {
		t = t[:i]
	}
	return t
}

// Start returns the span a decision under ctx is recorded on, with the
// context to decide under: the recording span of ctx (own false), or a
// new span of the decision's own (own true: the caller ends it).
// sampled is false when the new span records nothing: then there is
// nothing to time or record.
func (t *Tracer) Start(ctx context.Context) (_ context.Context, span trace.Span, own, sampled bool) {
	if span = trace.SpanFromContext(ctx); span.IsRecording() {
		return ctx, span, false, true
	}
	ctx, span = t.tracer.Start(ctx, "sluice.Check", t.start...)
	return ctx, span, true, span.IsRecording()
}

// Decision is what a decision the store took is recorded as.
type Decision struct {
	// Policy and Algorithm are the one policy's ID and algorithm;
	// Policies and Algorithms, when set instead, several policies', in
	// request order.
	Policy, Algorithm    string
	Policies, Algorithms []string
	Op, Outcome, Cause   string // Cause "" for none
	Denied, Failed       bool   // Failed: unavailable or indeterminate
	RetryAfter           time.Duration
	Replayed             bool
	Batch                int // 0: the store does not say
	Took                 time.Duration
}

// Record puts d on span: as an event, or as the attributes (and status)
// of the decision's own span.
func (t *Tracer) Record(span trace.Span, own bool, d *Decision) {
	attrs := make([]attribute.KeyValue, 0, 10)
	if d.Policies == nil {
		attrs = append(attrs, attrPolicy.String(d.Policy), attrAlgorithm.String(d.Algorithm))
	} else {
		attrs = append(attrs, attrPolicy.StringSlice(d.Policies), attrAlgorithm.StringSlice(d.Algorithms))
	}
	attrs = append(attrs, attrOperation.String(d.Op), attrOutcome.String(d.Outcome), t.kind, attrLatency.Int64(d.Took.Microseconds()))
	if d.Cause != "" {
		attrs = append(attrs, attrCause.String(d.Cause))
	}
	if d.Denied {
		attrs = append(attrs, attrRetryAfter.Int64(d.RetryAfter.Milliseconds()))
	}
	if d.Replayed {
		attrs = append(attrs, attrReplayed.Bool(true))
	}
	if d.Batch > 0 {
		attrs = append(attrs, attrBatch.Int(d.Batch))
	}
	if !own {
		span.AddEvent("sluice.decision", trace.WithAttributes(attrs...))
		return
	}
	span.SetAttributes(attrs...)
	if d.Failed {
		desc := d.Outcome
		if d.Cause != "" {
			desc += ": " + d.Cause
		}
		span.SetStatus(codes.Error, desc)
	}
}
