package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/server"
)

// The caller's W3C trace context in the tests below: trace 0af7…319c,
// span b7ad…3331, sampled.
const (
	callerTrace  = "0af7651916cd43dd8448eb211c80319c"
	callerSpan   = "b7ad6b7169203331"
	traceparent  = "00-" + callerTrace + "-" + callerSpan + "-01"
	secretPerson = "alice-the-subject"
)

// tracedServe runs config (written to a file) with a TracerProvider that
// records into the returned in-memory exporter.
func tracedServe(t *testing.T, files map[string]string) (*running, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	dir := t.TempDir()
	writeTree(t, dir, files)
	return startRunWith(t, server.RunOptions{ConfigPath: filepath.Join(dir, "sluice.yaml"), TracerProvider: tp}, ""), exp
}

// childOfCaller waits for the span that is a child of the caller's span
// in the caller's trace, and returns it.
func childOfCaller(t *testing.T, exp *tracetest.InMemoryExporter) tracetest.SpanStub {
	t.Helper()
	var found tracetest.SpanStub
	waitUntil(t, "a span whose parent is the caller's", func() bool { // a server span ends after its answer is sent
		for _, s := range exp.GetSpans() {
			if s.Parent.TraceID().String() == callerTrace && s.Parent.SpanID().String() == callerSpan && s.Parent.IsRemote() {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

// decisionIn returns the attributes of the sluice.decision event of span,
// failing the test when there is none, and checks that no span of exp
// names the subject (or, where the subject is the client's address,
// that address).
func decisionIn(t *testing.T, exp *tracetest.InMemoryExporter, span tracetest.SpanStub, secrets ...string) map[string]string {
	t.Helper()
	for _, s := range exp.GetSpans() {
		dump := fmt.Sprintf("%+v", s)
		for _, secret := range secrets {
			if strings.Contains(dump, secret) {
				t.Errorf("span %q names %q: %s", s.Name, secret, dump)
			}
		}
	}
	for _, e := range span.Events {
		if e.Name == "sluice.decision" {
			got := map[string]string{}
			for _, a := range e.Attributes {
				got[string(a.Key)] = a.Value.String()
			}
			return got
		}
	}
	t.Fatalf("span %q has no sluice.decision event: %+v", span.Name, span.Events)
	return nil
}

// TestTraceCheckAPI: a check API request over a real socket that carries
// a traceparent is served in a span that is a child of the caller's,
// holding the decision (policy, algorithm, operation, outcome, store) and
// naming no subject.
func TestTraceCheckAPI(t *testing.T) {
	r, exp := tracedServe(t, map[string]string{"sluice.yaml": `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
`})
	req, err := http.NewRequest("POST", r.url+"/v1/check", strings.NewReader(`{"policy":"demo","subject":"`+secretPerson+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /v1/check = %d, want 200", resp.StatusCode)
	}
	span := childOfCaller(t, exp)
	if span.Name != "sluice POST /v1/check" || span.SpanKind != trace.SpanKindServer {
		t.Errorf("span %q (kind %v), want the check API's server span, sluice POST /v1/check", span.Name, span.SpanKind)
	}
	got := decisionIn(t, exp, span, secretPerson)
	for k, v := range map[string]string{"sluice.policy": "demo", "sluice.algorithm": "fixed_window", "sluice.operation": "spend", "sluice.outcome": "allowed", "sluice.store": "memstore"} {
		if got[k] != v {
			t.Errorf("decision %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// TestTraceEnvoy: an Envoy RLS call over a real gRPC socket whose
// metadata carries a traceparent is served in a span that is a child of
// the caller's, holding the decision and naming no descriptor value.
func TestTraceEnvoy(t *testing.T) {
	r, exp := tracedServe(t, map[string]string{"sluice.yaml": envoyConfig(""), "rules/shop.yaml": rulesFile(2)})
	c := envoyClient(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
	resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{
		{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user", Value: secretPerson}}},
	}})
	if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit = %v, %v, want OK", resp, err)
	}
	span := childOfCaller(t, exp)
	if span.Name != "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" || span.SpanKind != trace.SpanKindServer {
		t.Errorf("span %q (kind %v), want the ShouldRateLimit server span", span.Name, span.SpanKind)
	}
	got := decisionIn(t, exp, span, secretPerson)
	if got["sluice.outcome"] != "allowed" || got["sluice.operation"] != "spend" || got["sluice.policy"] == "" {
		t.Errorf("decision = %v, want an allowed spend of a policy", got)
	}
}

// TestTraceProxy: a request through the proxy that carries a traceparent
// is served in a span that is a child of the caller's, holding the
// decision, and reaches the upstream with a traceparent naming that
// span as its parent, in the caller's trace.
func TestTraceProxy(t *testing.T) {
	var mu sync.Mutex
	var upstreamSaw string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamSaw = r.Header.Get("traceparent")
		mu.Unlock()
	}))
	defer up.Close()
	r, exp := tracedServe(t, map[string]string{"sluice.yaml": `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: edge, algorithm: gcra, limit: 10, window: 1s }
proxy:
  listen: "127.0.0.1:0"
  upstream: "` + up.URL + `"
  routes:
    - { match: { path_prefix: / }, policies: [edge], subject: ip }
`})
	m := proxyListening.FindStringSubmatch(r.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", r.logs)
	}
	req, err := http.NewRequest("GET", m[1]+"/orders/"+secretPerson, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET through the proxy = %d, want 200", resp.StatusCode)
	}
	span := childOfCaller(t, exp)
	if span.Name != "proxy GET" {
		t.Errorf("span %q, want the proxy's server span, proxy GET", span.Name)
	}
	got := decisionIn(t, exp, span, secretPerson, "127.0.0.1")
	if got["sluice.policy"] != "edge" || got["sluice.outcome"] != "allowed" {
		t.Errorf("decision = %v, want edge allowed", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "00-" + callerTrace + "-" + span.SpanContext.SpanID().String() + "-01"; upstreamSaw != want {
		t.Errorf("the upstream got traceparent %q, want %q: the proxy's span as its parent", upstreamSaw, want)
	}
}
