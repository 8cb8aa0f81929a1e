package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/logthrottle"
)

// tracerName is the instrumentation scope of the server's own spans.
const tracerName = "github.com/sluicehq/sluice/internal/server"

// tracing is how serve traces: a span per request of the check API, the
// proxy and the Envoy service, each continuing the W3C trace context
// (traceparent, tracestate) the request carries, and the Limiters'
// decisions in them (sluice.Options.TracerProvider). The proxy passes its
// span's context on to the upstream. A nil *tracing traces nothing.
type tracing struct {
	tp       trace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	shutdown func(context.Context) error // flushes and stops the exporter; nil for a provider Run was handed
	unroute  func()                      // gives back the SDK's errors (see routeOTelErrors); nil with shutdown
}

// newTracing returns the tracing of cfg's telemetry section: an OTLP
// exporter to its endpoint, its errors logged to log (throttled on
// clock), or tp when set (RunOptions.TracerProvider). Nil when neither
// is.
func newTracing(cfg *config.Telemetry, tp trace.TracerProvider, log *slog.Logger, clock sluice.Clock) (*tracing, error) {
	t := &tracing{tp: tp, prop: propagation.TraceContext{}}
	if tp == nil {
		if cfg == nil {
			return nil, nil
		}
		sdk, err := newTracerProvider(cfg)
		if err != nil {
			return nil, err
		}
		t.tp, t.shutdown = sdk, sdk.Shutdown
		t.unroute = routeOTelErrors(log, clock)
	}
	t.tracer = t.tp.Tracer(tracerName)
	return t, nil
}

// newTracerProvider builds the SDK's provider for cfg: spans batched to an
// OTLP exporter, sampled at cfg.SamplingRatio unless the caller's trace
// context decided. Each batch is sent once, not retried: the exporter's
// retries (5s apart, for up to a minute) held the batch processor, and a
// shutdown waited out its whole bound for a collector that refused every
// connection; the next batch follows within 5s anyway, and a failed one
// is logged (throttled) and dropped.
func newTracerProvider(cfg *config.Telemetry) (*sdktrace.TracerProvider, error) {
	var exp sdktrace.SpanExporter
	var err error
	ctx := context.Background() // the exporters connect lazily: nothing waits on it
	switch cfg.Protocol {
	case config.ProtocolHTTP:
		endpoint := cfg.Endpoint
		if u, perr := url.Parse(endpoint); perr == nil && (u.Path == "" || u.Path == "/") {
			endpoint = strings.TrimSuffix(endpoint, "/") + "/v1/traces" // OTLP/HTTP's path, which a URL without one would not reach
		}
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	default:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(cfg.Endpoint), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	}
	if err != nil {
		return nil, fmt.Errorf("serve: telemetry.endpoint %q: %w", cfg.Endpoint, err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName))),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRatio))),
	), nil
}

// provider is the TracerProvider of the Limiters: nil (no tracing) for a
// nil t.
func (t *tracing) provider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.tp
}

// close flushes the spans not yet exported, within ctx.
func (t *tracing) close(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	defer t.unroute()
	return t.shutdown(ctx)
}

// otelErrors receives the errors of the OpenTelemetry SDK (failed exports,
// above all), which otel.SetErrorHandler sets for the whole process: the
// handler installed once forwards to the log of the server that routed
// them last, and drops them while none does (the SDK's default wrote
// every one to stderr, ~13 lines a second for an unreachable collector).
var otelErrors struct {
	once sync.Once
	cur  atomic.Pointer[otelErrorLog]
}

// otelErrorLog logs the SDK's errors, otelErrorBurst per otelErrorEvery
// at most, with the count of those held back.
type otelErrorLog struct {
	log      *slog.Logger
	clock    sluice.Clock
	throttle logthrottle.Throttle
}

const (
	otelErrorEvery = 10 * time.Second
	otelErrorBurst = 3
)

// routeOTelErrors sends the SDK's errors to log, throttled on clock,
// until the function it returns is called, which routes them back to
// where they went before (another server's log in tests that run
// several). Safe for concurrent use.
func routeOTelErrors(log *slog.Logger, clock sluice.Clock) (unroute func()) {
	otelErrors.once.Do(func() {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			if l := otelErrors.cur.Load(); l != nil {
				l.handle(err)
			}
		}))
	})
	l := &otelErrorLog{log: log, clock: clock, throttle: logthrottle.Throttle{Every: otelErrorEvery, Burst: otelErrorBurst}}
	prev := otelErrors.cur.Swap(l)
	return func() { otelErrors.cur.CompareAndSwap(l, prev) }
}

func (l *otelErrorLog) handle(err error) {
	if ok, held := l.throttle.Allow(l.clock.Now()); ok {
		l.log.Warn("telemetry: export failed", "reason", err, "not_logged", held)
	}
}

// handler serves h in a server span continuing the request's trace
// context, named what followed by the method (and, for the check API, the
// path of its own routes; never a proxied path, which may name a user).
func (t *tracing) handler(what string, withPath bool, h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		name := what + " " + r.Method
		attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method)}
		if withPath && tracedPath(r.URL.Path) {
			name += " " + r.URL.Path
			attrs = append(attrs, attribute.String("url.path", r.URL.Path))
		}
		ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(ctx))
		code := sw.status
		if code == 0 {
			code = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", code))
		if code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(code))
		}
	})
}

// tracedPath reports whether a check API span may be named by path: one
// of the API's own routes, never a path the client made up.
func tracedPath(p string) bool {
	switch p {
	case checkapi.CheckPath, checkapi.ReleasePath, checkapi.RenewPath, "/v1/config", "/v1/overrides":
		return true
	}
	return false
}

// transport passes the trace context of each request's span on to the
// upstream in its headers (the proxy's); next when t is nil.
func (t *tracing) transport(next http.RoundTripper) http.RoundTripper {
	if t == nil {
		return next
	}
	return tracedTransport{next: next, prop: t.prop}
}

type tracedTransport struct {
	next http.RoundTripper
	prop propagation.TextMapPropagator
}

func (tt tracedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	out := r.Clone(r.Context()) // a RoundTripper must not change the request it is handed
	tt.prop.Inject(r.Context(), propagation.HeaderCarrier(out.Header))
	return tt.next.RoundTrip(out)
}

// unary serves each gRPC call (the Envoy service's) in a server span
// continuing the trace context of its metadata; nil when t is.
func (t *tracing) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = t.prop.Extract(ctx, metadataCarrier(md))
		ctx, span := t.tracer.Start(ctx, info.FullMethod, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", info.FullMethod)))
		defer span.End()
		resp, err := handler(ctx, req)
		if err != nil {
			span.SetStatus(codes.Error, status.Code(err).String())
		}
		return resp, err
	}
}

// metadataCarrier reads a trace context from gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
