package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
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
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

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

// collector is an OTLP trace receiver on loopback: over HTTP
// (POST /v1/traces) or gRPC, whichever the test starts.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu  sync.Mutex
	got []*coltracepb.ExportTraceServiceRequest
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serveHTTP starts c over OTLP/HTTP and returns its URL.
func (c *collector) serveHTTP(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || err != nil || proto.Unmarshal(body, req) != nil {
			t.Errorf("collector: %s %s (%d bytes, %v): want an OTLP export to /v1/traces", r.Method, r.URL.Path, len(body), err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		resp, _ := c.Export(r.Context(), req)
		b, _ := proto.Marshal(resp)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// serveGRPC starts c over OTLP/gRPC and returns its URL.
func (c *collector) serveGRPC(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return "http://" + ln.Addr().String()
}

// TestTelemetryExportsOTLP: with a telemetry section, serve exports its
// spans over OTLP (each protocol) to the collector at the endpoint, a
// real server on loopback here: the check API's span, a child of the
// caller's, with the decision event, under the configured service.name,
// flushed at shutdown, and no subject in the export.
func TestTelemetryExportsOTLP(t *testing.T) {
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			c := &collector{}
			endpoint := c.serveHTTP
			if protocol == "grpc" {
				endpoint = c.serveGRPC
			}
			dir := t.TempDir()
			writeTree(t, dir, map[string]string{"sluice.yaml": `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
telemetry: { endpoint: "` + endpoint(t) + `", protocol: ` + protocol + `, service_name: limiter-under-test }
`})
			r := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
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
			if err := r.stop(); err != nil { // shutting down flushes the batch of spans
				t.Fatal(err)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			checkExport(t, c.got)
		})
	}
}

// checkExport finds in got the span that is a child of the caller's and
// checks it, its resource and that nothing names the subject.
func checkExport(t *testing.T, got []*coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	var service string
	var span *tracepb.Span
	for _, req := range got {
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					if fmt.Sprintf("%x", s.TraceId) == callerTrace && fmt.Sprintf("%x", s.ParentSpanId) == callerSpan {
						span = s
					}
				}
			}
		}
	}
	if span == nil {
		t.Fatalf("the collector got %d exports and no span that is a child of the caller's", len(got))
	}
	if service != "limiter-under-test" {
		t.Errorf("service.name = %q, want limiter-under-test", service)
	}
	if len(span.Events) != 1 || span.Events[0].Name != "sluice.decision" {
		t.Errorf("span %q has events %v, want one sluice.decision", span.Name, span.Events)
	}
	if dump := fmt.Sprint(got); strings.Contains(dump, secretPerson) {
		t.Errorf("the export names the subject: %s", dump)
	}
}

// TestTelemetryUnreachableCollector: with the collector's port closed, a
// shutdown took 10.0s (the exporter's retries waited out the whole
// bound), not milliseconds, and each failed export wrote a line to
// stderr (~13 a second). Now the span flushed at shutdown is tried once,
// shutdown ends well within its bound, and the failure is in the
// server's log, throttled.
func TestTelemetryUnreachableCollector(t *testing.T) {
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			closed := ln.Addr().String()
			ln.Close()                                 // a port nothing listens on: every export is refused
			r := checkOnceAndStop(t, closed, protocol) // returns: a refused export fails at once, the flush is bounded (TestFlushDeadline)
			if logs := r.logs.String(); !strings.Contains(logs, "telemetry: export failed") {
				t.Errorf("the log lacks the failed export:\n%s", logs)
			}
		})
	}
}

// TestTelemetrySilentCollector: a collector that accepts connections and
// never answers (as a blackholed address holds a connect) held SIGTERM
// for the drain's whole 10 s. The flush at shutdown has its own bound
// (flushTimeout, TestFlushDeadline): serve stops while the collector
// still holds the export, and says the spans were not exported.
func TestTelemetrySilentCollector(t *testing.T) {
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			held := make(chan net.Conn, 16)
			go func() { // accepts and reads nothing, answers nothing
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					held <- c
				}
			}()
			t.Cleanup(func() {
				ln.Close()
				for {
					select {
					case c := <-held:
						c.Close()
					default:
						return
					}
				}
			})
			r := checkOnceAndStop(t, ln.Addr().String(), protocol) // returns: the collector never answered
			if logs := r.logs.String(); !strings.Contains(logs, "telemetry: spans not exported at shutdown") {
				t.Errorf("the log lacks the spans left unexported:\n%s", logs)
			}
		})
	}
}

// checkOnceAndStop serves a check API whose spans go to the collector at
// addr over protocol, sends it one check (a span to flush) and stops it.
func checkOnceAndStop(t *testing.T, addr, protocol string) *running {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
telemetry: { endpoint: "http://` + addr + `", protocol: ` + protocol + ` }
`})
	r := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	resp, err := http.Post(r.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"s"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	return r
}
