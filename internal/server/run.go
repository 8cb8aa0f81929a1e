package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkpb"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rlqs"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/wiring"
)

// RunOptions configure Run. The zero value serves the built-in example.
type RunOptions struct {
	// ConfigPath is the config file to serve and watch. Default: "", the
	// built-in example config (config.Default), which is not watched.
	ConfigPath string
	// Getenv reads the environment (secrets the config names). Default:
	// os.Getenv.
	Getenv func(string) string
	// Log receives the server's records. Default: slog.Default().
	Log *slog.Logger
	// Clock is the clock of the stores, timings and reload times.
	// Default: clock.NewMonotonic().
	Clock sluice.Clock
	// TracerProvider, when set, records the server's traces in place of
	// the telemetry section's OTLP exporter, as if the config had one
	// (tests hand in the SDK's in-memory exporter). Default: nil, the
	// telemetry section decides.
	TracerProvider trace.TracerProvider
}

// shutdownTimeout bounds how long Run waits for requests in flight once
// ctx is done.
const shutdownTimeout = 10 * time.Second

// flushTimeout bounds the flush of the spans not yet exported at
// shutdown, whatever the collector does: a collector that accepts and
// never answers (or a blackholed address) would otherwise hold SIGTERM
// for the drain's whole bound.
const flushTimeout = 2 * time.Second

// flushDeadline is when the flush at shutdown gives up, flushing from now:
// flushTimeout later, or the drain's deadline (zero when there was no
// drain) when that comes first.
func flushDeadline(now, drain time.Time) time.Time {
	if d := now.Add(flushTimeout); drain.IsZero() || d.Before(drain) {
		return d
	}
	return drain
}

// Run serves a whole configuration until ctx is done: the check API (and
// /metrics, /healthz, /readyz, /ui) on server.listen, with TLS when
// server.tls says so, the reverse proxy on proxy.listen, the Envoy
// rate-limit service and the gRPC check service (grpccheck.go) on
// envoy.listen. It builds the store the config
// names, reloads the config on SIGHUP and when one of its files changes
// (see watchSet), and shuts down gracefully. It returns nil after a clean
// shutdown; a config Run refuses is reported as Validate reports it.
func Run(ctx context.Context, opts RunOptions) error {
	opts = opts.withDefaults()
	l, err := load(opts.ConfigPath, opts.Getenv)
	if err != nil {
		return err
	}
	tlsConf, err := tlsConfig(l.cfg)
	if err != nil {
		return err
	}
	rn := &runner{opts: opts, log: opts.Log}
	defer rn.close()
	if rn.tracing, err = newTracing(l.cfg.Telemetry, opts.TracerProvider, opts.Log, opts.Clock); err != nil {
		return err
	}
	if err := rn.start(l); err != nil {
		return err
	}
	if err := rn.listen(l.cfg, tlsConf); err != nil {
		return err
	}
	served := rn.serve()

	// Reload on SIGHUP and when a file of the config changes.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	w, err := newWatcher(rn.log)
	if err != nil {
		rn.log.Warn("cannot watch the config files: reload with SIGHUP", "reason", err)
	}
	defer w.close()

	rn.logListening(l, tlsConf != nil)
	var failed error
	if err := rn.r.watchLoop(ctx, hup, w, served); err != nil {
		failed = fmt.Errorf("serve: %w", err)
	}
	return rn.shutdown(ctx, served, failed)
}

func (o RunOptions) withDefaults() RunOptions {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.NewMonotonic()
	}
	return o
}

// runner is one Run: what it built, for shutting down and closing.
type runner struct {
	opts     RunOptions
	log      *slog.Logger
	st       *wiring.Store
	fallback *wiring.Store // nil without a proxy section
	r        *reloader
	https    []*http.Server // the check API's, then the proxy's
	grpc     *grpc.Server   // nil without an envoy section
	lns      []net.Listener // https' listeners, then grpc's
	tracing  *tracing       // nil without a telemetry section
	deadline time.Time      // of the shutdown, once begun: the drain's and the spans' flush's
}

// start builds the metrics, the stores and the first generation of l.
func (rn *runner) start(l *loaded) error {
	cfg, clock := l.cfg, rn.opts.Clock
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	metrics, err := NewMetrics(reg, wiring.PolicyIDs(l.cfg, l.envoy))
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	reloadM, err := newReloadMetrics(reg)
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	if rn.st, err = wiring.NewStore(cfg.Store, wiring.StoreOptions{Clock: clock, Getenv: rn.opts.Getenv, Log: rn.log}); err != nil {
		return err
	}
	if rn.st.Evictions != nil {
		if err := metrics.CountEvictions(cfg.Store.Type, rn.st.Evictions, rn.st.LostIDs); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	if rn.st.Skipped != nil {
		if err := metrics.CountSkippedOverrides(cfg.Store.Type, rn.st.Skipped); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	r := &reloader{path: rn.opts.ConfigPath, getenv: rn.opts.Getenv, clock: clock, log: rn.log, tracing: rn.tracing,
		store: metrics.InstrumentStore(rn.st.Store, cfg.Store.Type, clock), info: StoreInfo{Type: rn.st.Type, Breaker: rn.st.Breaker, Batches: rn.st.Type == config.StoreRedis}, metrics: metrics, reloadM: reloadM}
	if rn.st.Ready != nil {
		r.ready = []Check{rn.st.Ready}
	}
	fb, err := wiring.NewFallbackStore(cfg, clock)
	if err != nil {
		return err
	}
	if fb != nil {
		rn.fallback, r.fallback = fb, fb.Store
	}
	if cfg.Envoy != nil && len(cfg.Envoy.Configs) > 0 {
		if r.rlsM, err = rls.NewMetrics(reg); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	if cfg.Envoy != nil && cfg.Envoy.RLQS != nil {
		if r.rlqsM, err = rlqs.NewMetrics(reg); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	g, err := r.build(l, 1)
	if err != nil {
		return err
	}
	r.cur.Store(g)
	r.observe(g)
	rn.r = r
	reloadM.generation.Set(1)
	reloadM.lastOK.Set(float64(g.loadedAt.Unix()))
	reloadM.warn(rn.log, l)
	if g.rls != nil {
		if r.rlsSvc, err = rls.New(g.rls, rls.Options{Logger: rn.log, Metrics: r.rlsM}); err != nil {
			return err
		}
	}
	if g.rlqs != nil {
		// Every instance on one Redis divides the same limits through
		// its ledger; on the embedded store, this one is the fleet.
		if r.rlqsSvc, err = rlqs.New(*g.rlqs, rlqs.Options{Redis: rn.st.Client, Pseudonymizer: g.pseud,
			Overrides: r.rlqsPlans, Clock: clock, Logger: rn.log, Metrics: r.rlqsM}); err != nil {
			return err
		}
	}
	return nil
}

// listen builds the servers of cfg and opens their listeners.
func (rn *runner) listen(cfg *config.Config, tlsConf *tls.Config) error {
	errorLog := slog.NewLogLogger(rn.log.Handler(), slog.LevelWarn)
	// The check API is net/http's alone, with its timeouts
	// (docs/check-api.md): a request's header within 5 s of its start (a
	// connection that sends nothing is closed then), the whole request
	// within 10 s, its answer within 10 s, and a keep-alive connection
	// closed after 60 s without a request.
	rn.https = []*http.Server{{
		Handler:           rn.tracing.handler("sluice", true, rn.r.serveWith(func(g *generation) http.Handler { return g.api })),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          errorLog,
		TLSConfig:         tlsConf,
	}}
	addrs, fields := []string{cfg.Server.Listen}, []string{"server.listen"}
	if cfg.Proxy != nil {
		// No write timeout: downloads and streams from the upstream may
		// take as long as they take; a request must arrive within
		// proxy.read_timeout, so a slow body cannot hold a connection.
		rn.https = append(rn.https, &http.Server{
			Handler:           rn.tracing.handler("proxy", false, rn.r.serveWith(func(g *generation) http.Handler { return g.proxy })),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       cfg.Proxy.ReadTimeout,
			IdleTimeout:       60 * time.Second,
			ErrorLog:          errorLog,
		})
		addrs, fields = append(addrs, cfg.Proxy.Listen), append(fields, "proxy.listen")
	}
	if cfg.Envoy != nil {
		gopts := rls.ServerOptions()
		if rn.tracing != nil {
			gopts = append(gopts, grpc.UnaryInterceptor(rn.tracing.unary()))
		}
		rn.grpc = grpc.NewServer(gopts...)
		if rn.r.rlsSvc != nil {
			rn.r.rlsSvc.Register(rn.grpc)
		}
		if rn.r.rlqsSvc != nil {
			rn.r.rlqsSvc.Register(rn.grpc)
		}
		checkpb.RegisterCheckServiceServer(rn.grpc, &checkService{server: rn.r.current})
		addrs, fields = append(addrs, cfg.Envoy.Listen), append(fields, "envoy.listen")
	}
	for i, addr := range addrs {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("serve: %s %q: %w", fields[i], addr, err)
		}
		rn.lns = append(rn.lns, ln)
	}
	return nil
}

// serve serves every listener; each server's end is sent on the channel.
func (rn *runner) serve() <-chan error {
	served := make(chan error, len(rn.lns))
	for i, srv := range rn.https {
		go func() {
			if srv.TLSConfig != nil {
				served <- srv.ServeTLS(rn.lns[i], "", "") // the certificate is in TLSConfig
				return
			}
			served <- srv.Serve(rn.lns[i])
		}()
	}
	if rn.grpc != nil {
		go func() { served <- rn.grpc.Serve(rn.lns[len(rn.lns)-1]) }()
	}
	return served
}

// logListening says where each service listens. The check API's line is
// last: once it is out, every listener is serving.
func (rn *runner) logListening(l *loaded, tls bool) {
	cfg := l.cfg
	if cfg.Proxy != nil {
		rn.log.Info("proxy listening", "addr", "http://"+rn.lns[1].Addr().String(), "upstream", cfg.Proxy.Upstream, "routes", len(cfg.Proxy.Routes))
	}
	if cfg.Envoy != nil {
		attrs := []any{"addr", rn.lns[len(rn.lns)-1].Addr().String()}
		if l.envoy != nil {
			attrs = append(attrs, "domains", strings.Join(l.envoy.Domains(), ","), "rules", len(l.envoy.Rules()), "files", len(l.envoy.Files()))
		}
		if rq := cfg.Envoy.RLQS; rq != nil {
			attrs = append(attrs, "rlqs_domains", len(rq.Domains))
		}
		rn.log.Info("envoy rate-limit service listening", attrs...)
	}
	scheme, source := "http://", "the built-in example config"
	if tls {
		scheme = "https://"
	}
	if rn.opts.ConfigPath != "" {
		source = rn.opts.ConfigPath
	}
	// The last line names every service's address, and says when the
	// check API's is the default (no server: section, or no listen).
	listen := "server.listen"
	if cfg.Line("server.listen") == 0 {
		listen = "default " + config.DefaultListen
	}
	attrs := []any{"addr", scheme + rn.lns[0].Addr().String(), "addr_from", listen}
	if cfg.Proxy != nil {
		attrs = append(attrs, "proxy_addr", "http://"+rn.lns[1].Addr().String())
	}
	if cfg.Envoy != nil {
		attrs = append(attrs, "envoy_addr", rn.lns[len(rn.lns)-1].Addr().String())
	}
	attrs = append(attrs, "config", source, "store", cfg.Store.Type)
	if rn.st.MaxKeys > 0 {
		attrs = append(attrs, "max_keys", rn.st.MaxKeys) // the embedded store's bound, configured or derived
	}
	attrs = append(attrs, "policies", strings.Join(wiring.PolicyIDs(cfg, nil), ","))
	rn.log.Info("listening", attrs...)
}

// shutdown stops the servers, waiting up to shutdownTimeout for requests
// in flight, and returns failed, else the first error a server ended
// with.
func (rn *runner) shutdown(ctx context.Context, served <-chan error, failed error) error {
	rn.log.Info("shutting down", "timeout", shutdownTimeout)
	rn.deadline = time.Now().Add(shutdownTimeout)
	shutdownCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), rn.deadline)
	defer cancel()
	if rn.grpc != nil {
		if rn.r.rlsSvc != nil {
			rn.r.rlsSvc.Shutdown()
		}
		if rn.r.rlqsSvc != nil {
			// Every Envoy hears its assignments expire now before the
			// streams end (docs/rlqs.md, "Shutdown").
			rn.r.rlqsSvc.Shutdown(shutdownCtx)
		}
		stopped := make(chan struct{})
		go func() { rn.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-shutdownCtx.Done():
			rn.grpc.Stop()
			<-stopped
		}
	}
	for _, srv := range rn.https {
		if err := srv.Shutdown(shutdownCtx); err != nil && failed == nil {
			failed = fmt.Errorf("serve: shut down: %w", err)
		}
	}
	if failed != nil {
		return failed
	}
	// http.Server.Serve ends with ErrServerClosed, grpc.Server.Serve with
	// nil, after a clean shutdown.
	for range rn.lns {
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	rn.log.Info("stopped")
	return nil
}

// close releases what start and listen built, in reverse order.
func (rn *runner) close() {
	for _, ln := range rn.lns {
		ln.Close() // closed already after Serve; the error says so
	}
	if rn.r != nil {
		rn.r.cur.Load().retire()
	}
	if rn.fallback != nil {
		rn.fallback.Close()
	}
	if rn.st != nil {
		rn.st.Close()
	}
	ctx, cancel := context.WithDeadline(context.Background(), flushDeadline(time.Now(), rn.deadline))
	defer cancel()
	if err := rn.tracing.close(ctx); err != nil {
		rn.log.Warn("telemetry: spans not exported at shutdown", "reason", err)
	}
}
