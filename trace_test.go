package sluice_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkCheckTracing is BenchmarkCheck with each form of tracing.
// Without a request's span: off (no TracerProvider, BenchmarkCheck's
// case) and a no-op provider. Inside a request's span, started and ended
// around each Check by a recording provider (every span sampled, handed
// to a batching processor whose exporter drops it), as in a traced
// service: request-off (no TracerProvider: the reference, what the
// request's span costs), request-span (the decision is a span of its own:
// the context holds only the request's span context, no span that
// records) and request-event (the decision is an event on the request's
// span).
func BenchmarkCheckTracing(b *testing.B) {
	rec := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { rec.Shutdown(context.Background()) })
	for _, c := range []struct {
		name    string
		tp      trace.TracerProvider
		request bool // each Check runs in a request's span
		own     bool // the request's span is not in the context: the decision is a span of its own
	}{
		{"off", nil, false, false},
		{"noop", noop.NewTracerProvider(), false, false},
		{"request-off", nil, true, false},
		{"request-span", rec, true, true},
		{"request-event", rec, true, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			l, subjects := newCheckBench(b, sluice.Options{TracerProvider: c.tp})
			tracer := rec.Tracer("caller")
			rng := uint64(0x9E3779B97F4A7C15)
			b.ReportAllocs()
			for b.Loop() {
				ctx := context.Background()
				var request trace.Span
				if c.request {
					ctx, request = tracer.Start(ctx, "request")
				}
				if c.own {
					ctx = trace.ContextWithRemoteSpanContext(context.Background(), request.SpanContext())
				}
				if o := l.Check(ctx, sluice.Request{Policy: "p", Subject: subjects[nextSubject(&rng)]}); o.Kind != sluice.Allowed {
					b.Fatalf("Check = %+v, want allowed", o)
				}
				if c.request {
					request.End()
				}
			}
		})
	}
}

// breakerStore is a real store whose breaker the test opens: while open,
// it answers CircuitOpen without deciding, as redisstore's does. It
// unwraps to the store, which a trace names.
type breakerStore struct {
	sluice.Store
	open atomic.Bool
}

func (s *breakerStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	if s.open.Load() {
		return fmt.Errorf("breakerStore: %w", sluice.CircuitOpen)
	}
	return s.Store.Evaluate(ctx, ev)
}

func (s *breakerStore) Unwrap() sluice.Store { return s.Store }

// TestCheckTraced: with a TracerProvider, a decision inside a recording
// span is an event on it, and one with only a remote parent is a span of
// its own, a child of that parent; each carries the policies, their
// algorithms, the operation, the outcome (and cause), the store (named
// through a wrapper) and its latency, and neither names the subject
// anywhere. A request answered before the store is asked is not
// recorded. Without a TracerProvider, nothing is.
func TestCheckTraced(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	ms, err := memstore.New(memstore.Options{Clock: sluicetest.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	policies := []sluice.Policy{
		{ID: "login", Algorithm: sluice.SlidingLog, Limit: 1, Window: time.Minute},
		{ID: "day", Algorithm: sluice.FixedWindow, Limit: 100, Window: 24 * time.Hour},
	}
	store := &breakerStore{Store: ms}
	l, err := sluice.New(store, policies, sluice.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	const subject = "k1.secret-pseudonym-of-alice"

	ctx, request := tp.Tracer("test").Start(context.Background(), "request")
	l.Check(ctx, sluice.Request{Policy: "login", Subject: subject})
	l.Check(ctx, sluice.Request{Policies: []string{"login", "day"}, Subject: subject, EvaluationID: "ev-1"})
	store.open.Store(true)
	l.Check(ctx, sluice.Request{Policy: "login", Subject: subject})
	store.open.Store(false)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	l.Check(cancelled, sluice.Request{Policy: "login", Subject: subject}) // answered before the store: not recorded
	request.End()

	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true})
	l.Check(trace.ContextWithRemoteSpanContext(context.Background(), parent), sluice.Request{Op: sluice.Peek, Policy: "day", Subject: subject})

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans recorded, want 2 (the request's, then the peek's own): %v", len(spans), spans)
	}
	for _, s := range spans {
		if dump := fmt.Sprintf("%+v", s); strings.Contains(dump, "alice") || strings.Contains(dump, "ev-1") {
			t.Errorf("span %q names the subject or the evaluation id: %s", s.Name, dump)
		}
	}
	req := spans[0]
	if req.Name != "request" || len(req.Events) != 3 {
		t.Fatalf("request span %q has %d events, want 3 decisions: %+v", req.Name, len(req.Events), req.Events)
	}
	want := []map[string]string{
		{"sluice.policy": "login", "sluice.algorithm": "sliding_log", "sluice.operation": "spend", "sluice.outcome": "allowed", "sluice.store": "memstore", "sluice.store.latency_us": "*"},
		{"sluice.policy": `["login","day"]`, "sluice.algorithm": `["sliding_log","fixed_window"]`, "sluice.operation": "spend", "sluice.outcome": "denied", "sluice.store": "memstore", "sluice.store.latency_us": "*", "sluice.retry_after_ms": "60000"},
		{"sluice.policy": "login", "sluice.algorithm": "sliding_log", "sluice.operation": "spend", "sluice.outcome": "unavailable", "sluice.cause": "circuit_open", "sluice.store": "memstore", "sluice.store.latency_us": "*"},
	}
	for i, e := range req.Events {
		if e.Name != "sluice.decision" {
			t.Errorf("event %d is %q, want sluice.decision", i, e.Name)
		}
		checkAttrs(t, fmt.Sprintf("event %d", i), e.Attributes, want[i])
	}
	own := spans[1]
	if own.Name != "sluice.Check" || !own.Parent.Equal(parent) || own.SpanContext.TraceID() != parent.TraceID() {
		t.Fatalf("peek span %q has parent %v, want sluice.Check, a child of %v", own.Name, own.Parent, parent)
	}
	checkAttrs(t, "peek span", own.Attributes, map[string]string{"sluice.policy": "day", "sluice.algorithm": "fixed_window", "sluice.operation": "peek", "sluice.outcome": "allowed", "sluice.store": "memstore", "sluice.store.latency_us": "*"})

	exp.Reset()
	off, err := sluice.New(ms, policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, request = tp.Tracer("test").Start(context.Background(), "request")
	off.Check(ctx, sluice.Request{Policy: "day", Subject: subject})
	request.End()
	if spans := exp.GetSpans(); len(spans) != 1 || len(spans[0].Events) != 0 {
		t.Fatalf("without a TracerProvider: spans %+v, want the request's alone, with no event", spans)
	}
}

// checkAttrs compares attrs with want, attribute by attribute ("*": any
// value).
func checkAttrs(t *testing.T, what string, attrs []attribute.KeyValue, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, a := range attrs {
		got[string(a.Key)] = a.Value.String()
		if v, ok := want[string(a.Key)]; ok && v == "*" {
			got[string(a.Key)] = "*"
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: attributes (-want +got):\n%s", what, diff)
	}
}

// TestNoTracingSDK: the library's packages reach OpenTelemetry through
// its API only; the SDK and the exporters are the application's choice
// (sluice serve's in internal/server).
func TestNoTracingSDK(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the library's imports: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".", "./memstore", "./redisstore", "./httplimit").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	api := false
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "go.opentelemetry.io/otel/sdk") || strings.HasPrefix(pkg, "go.opentelemetry.io/otel/exporters") {
			t.Errorf("the library imports %s: only the OpenTelemetry API is allowed", pkg)
		}
		api = api || pkg == "go.opentelemetry.io/otel/trace"
	}
	if !api {
		t.Errorf("go list -deps shows no go.opentelemetry.io/otel/trace: the check lists the wrong packages")
	}
}
