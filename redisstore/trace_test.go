package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTraceShowsTheBatch: a traced Limiter over the store records, for
// each decision, how many decisions shared its round trip
// (Evaluation.Batch): the decisions queued behind one on the wire carry
// the size of the round trip that took them, exactly as many of each size
// as the round trips go-redis saw, and the store is named "redisstore".
func TestTraceShowsTheBatch(t *testing.T) {
	srv, _, hook, s := queueingStore(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	const queued = 20
	p := policy(t, "traced", sluice.FixedWindow, 100, time.Minute)
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	resume := holdWire(t, srv, hook, s, subject(t), p)
	var wg sync.WaitGroup
	for range queued {
		wg.Go(func() {
			ctx, span := tp.Tracer("test").Start(context.Background(), "request")
			defer span.End()
			if o := l.Check(ctx, sluice.Request{Policy: "traced", Subject: subject(t)}); o.Kind != sluice.Allowed {
				t.Errorf("Check = %+v, want allowed", o)
			}
		})
	}
	waitQueued(t, s, hook, queued) // the callers queue behind the decision on the wire
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	var got []int
	for _, span := range exp.GetSpans() {
		for _, e := range span.Events {
			for _, a := range e.Attributes {
				switch {
				case a.Key == "sluice.store.batch":
					got = append(got, int(a.Value.AsInt64()))
				case a.Key == "sluice.store" && a.Value.AsString() != "redisstore":
					t.Errorf("sluice.store = %q, want redisstore", a.Value.AsString())
				}
			}
		}
	}
	hook.mu.Lock()
	var want []int
	for _, n := range hook.pipelines {
		for range n {
			want = append(want, n)
		}
	}
	for range hook.singles - 1 { // the decision held on the wire was not traced
		want = append(want, 1)
	}
	hook.mu.Unlock()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("sluice.store.batch of the %d decisions = %v, want %v (round trips: %d single, pipelines %v)", queued, got, want, hook.singles, hook.pipelines)
	}
	if slices.Max(got) < 2 {
		t.Fatalf("sluice.store.batch = %v: no decision shared a round trip", got)
	}
	t.Logf("batch sizes recorded: %v", got)
}
