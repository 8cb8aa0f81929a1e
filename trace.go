package sluice

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/clock"

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

// tracedStore is the Store of a Limiter with a TracerProvider: it records
// each decision asked of the store it wraps. A decision whose context
// holds a recording span (the caller's request) is an event on that span,
// which costs less than a span of its own (BENCHMARKS.md, "Tracing") and
// shows the same; a decision with no recording span to join (a context
// with no span, or only a remote parent's) is a span of its own,
// "sluice.Check". A Limiter without a TracerProvider calls its store
// directly: tracing off costs nothing.
type tracedStore struct {
	store  Store
	tracer trace.Tracer
	start  []trace.SpanStartOption
	kind   attribute.KeyValue // sluice.store
}

func newTracedStore(tp trace.TracerProvider, store Store) *tracedStore {
	return &tracedStore{
		store:  store,
		tracer: tp.Tracer(tracerName),
		start:  []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)},
		kind:   attrStore.String(storeKind(store)),
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

// Evaluate asks the store for ev's decision and records it.
func (s *tracedStore) Evaluate(ctx context.Context, ev *Evaluation) error {
	span, own := trace.SpanFromContext(ctx), false
	if !span.IsRecording() {
		ctx, span = s.tracer.Start(ctx, "sluice.Check", s.start...)
		own = true
		defer span.End()
		if !span.IsRecording() { // not sampled: nothing to time or record
			return s.store.Evaluate(ctx, ev)
		}
	}
	t0 := clock.System{}.Now()
	err := s.store.Evaluate(ctx, ev)
	s.record(span, own, ev, err, clock.System{}.Now().Sub(t0))
	return err
}

// record puts the decision the store took for ev (or err) on span: as an
// event, or as the attributes of the decision's own span.
func (s *tracedStore) record(span trace.Span, own bool, ev *Evaluation, err error, took time.Duration) {
	o := failed(err) // the Outcome Limiter will make of it
	switch {
	case err != nil:
	case len(ev.Statuses) != len(ev.Policies):
		o.Kind = Incompatible
	default:
		o.Status, o.Replayed = mostRestrictive(ev.Statuses), ev.Replayed
		o.Kind = Allowed
		if !o.Allowed {
			o.Kind = Denied
		}
	}
	attrs := make([]attribute.KeyValue, 0, 10)
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
	attrs = append(attrs, attrOperation.String(ev.Op.String()), attrOutcome.String(o.Kind.String()), s.kind,
		attrLatency.Int64(took.Microseconds()))
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
