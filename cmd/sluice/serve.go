package main

import (
	"context"
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
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/subject"
)

// shutdownTimeout bounds how long serve waits for requests in flight
// after a signal.
const shutdownTimeout = 10 * time.Second

func (a *app) serve(ctx context.Context, args []string) error {
	fs := newFlagSet("serve")
	var path, level, format string
	fs.StringVar(&path, "config", "", "read the config from `FILE` (default: the built-in example)")
	fs.StringVar(&path, "c", "", "shorthand for --config")
	fs.StringVar(&level, "log-level", "info", "log at `LEVEL`: debug (every decision), info, warn or error")
	fs.StringVar(&format, "log-format", "text", "write log records as `FORMAT`: text (key=value) or json")
	if err := a.parseFlags(fs, serveSynopsis, args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	log, err := newLogger(a.stderr, level, format)
	if err != nil {
		return err
	}

	l, err := load(path, a.getenv)
	if err != nil {
		return err
	}
	cfg := l.cfg
	source := "the built-in example config"
	if path != "" {
		source = path
	}
	tlsConf, err := tlsConfig(cfg)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	ids := policyIDs(cfg)
	metrics, err := server.NewMetrics(reg, ids)
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	reloadM, err := newReloadMetrics(reg)
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}

	st, err := newStore(ctx, cfg, a.clock, a.getenv, log)
	if err != nil {
		return err
	}
	defer st.close()
	if st.evictions != nil {
		if err := metrics.CountEvictions(cfg.Store.Type, st.evictions, st.lostIDs); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	r := &reloader{a: a, path: path, log: log, store: metrics.InstrumentStore(st.store, cfg.Store.Type, a.clock), ready: st.ready, info: st.info, metrics: metrics, reloadM: reloadM}
	if cfg.Envoy != nil {
		if r.rlsM, err = rls.NewMetrics(reg); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	g, err := r.build(l, 1)
	if err != nil {
		return err
	}
	r.cur.Store(g)
	defer func() { r.cur.Load().retire() }()
	reloadM.generation.Set(1)
	reloadM.lastOK.Set(float64(g.loadedAt.Unix()))

	servers := []*http.Server{{
		Handler:           r.serveWith(func(g *generation) http.Handler { return g.api }),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		TLSConfig:         tlsConf,
	}}
	addrs := []string{cfg.Server.Listen}
	fields := []string{"server.listen"}
	if cfg.Proxy != nil {
		// No write timeout: downloads and streams from the upstream may
		// take as long as they take; a request must arrive within
		// proxy.read_timeout, so a slow body cannot hold a connection.
		servers = append(servers, &http.Server{
			Handler:           r.serveWith(func(g *generation) http.Handler { return g.proxy }),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       cfg.Proxy.ReadTimeout,
			IdleTimeout:       60 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		})
		addrs = append(addrs, cfg.Proxy.Listen)
		fields = append(fields, "proxy.listen")
	}
	var grpcSrv *grpc.Server
	if cfg.Envoy != nil {
		if r.rlsSvc, err = rls.New(g.rls, rls.Options{Logger: log, Metrics: r.rlsM}); err != nil {
			return err
		}
		grpcSrv = grpc.NewServer()
		r.rlsSvc.Register(grpcSrv)
		addrs = append(addrs, cfg.Envoy.Listen)
		fields = append(fields, "envoy.listen")
	}
	lns := make([]net.Listener, len(addrs))
	for i, addr := range addrs {
		if lns[i], err = net.Listen("tcp", addr); err != nil {
			for _, ln := range lns[:i] {
				ln.Close()
			}
			return fmt.Errorf("serve: %s %q: %w", fields[i], addr, err)
		}
	}
	served := make(chan error, len(addrs))
	for i, srv := range servers {
		go func() {
			if srv.TLSConfig != nil {
				served <- srv.ServeTLS(lns[i], "", "") // the certificate is in TLSConfig
				return
			}
			served <- srv.Serve(lns[i])
		}()
	}
	scheme := "http://"
	if tlsConf != nil {
		scheme = "https://"
	}
	if grpcSrv != nil {
		go func() { served <- grpcSrv.Serve(lns[len(lns)-1]) }()
	}

	// Reload on SIGHUP and when a watched directory changes.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	w, err := newWatcher(log)
	if err != nil {
		log.Warn("cannot watch the config files: reload with SIGHUP", "reason", err)
	}
	defer w.close()
	if path != "" {
		w.add(l.watchDirs(path))
	}

	if cfg.Proxy != nil {
		log.Info("proxy listening", "addr", "http://"+lns[1].Addr().String(), "upstream", cfg.Proxy.Upstream, "routes", len(cfg.Proxy.Routes))
	}
	if cfg.Envoy != nil {
		log.Info("envoy rate-limit service listening", "addr", lns[len(lns)-1].Addr().String(), "domains", strings.Join(l.envoy.Domains(), ","), "rules", len(l.envoy.Rules()), "files", len(l.envoy.Files()))
	}
	// Last: once this line is out, every listener is serving.
	log.Info("listening", "addr", scheme+lns[0].Addr().String(), "config", source, "store", cfg.Store.Type, "policies", strings.Join(ids, ","))

	var failed error
	if err := r.watchLoop(ctx, hup, w, served); err != nil {
		failed = fmt.Errorf("serve: %w", err)
	}
	log.Info("shutting down", "timeout", shutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if grpcSrv != nil {
		r.rlsSvc.Shutdown()
		stopped := make(chan struct{})
		go func() { grpcSrv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-shutdownCtx.Done():
			grpcSrv.Stop()
			<-stopped
		}
	}
	for _, srv := range servers {
		if err := srv.Shutdown(shutdownCtx); err != nil && failed == nil {
			failed = fmt.Errorf("serve: shut down: %w", err)
		}
	}
	if failed != nil {
		return failed
	}
	// http.Server.Serve ends with ErrServerClosed, grpc.Server.Serve with
	// nil, after a clean shutdown.
	for range addrs {
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	log.Info("stopped")
	return nil
}

// pseudonymizer builds the subject pseudonymizer from subjects.hmac_keys,
// warning when there is none.
func (a *app) pseudonymizer(cfg *config.Config, log *slog.Logger) (*subject.Pseudonymizer, error) {
	keys, err := cfg.HMACKeys(a.getenv)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		log.Warn("subjects.hmac_keys is not configured: subjects are digested with plain SHA-256, without a key, so anyone who can guess a subject can recompute its pseudonym; configure an HMAC key")
		return subject.Unkeyed(), nil
	}
	p, err := subject.New(keys)
	if err != nil {
		return nil, fmt.Errorf("subjects.hmac_keys: %w", err)
	}
	return p, nil
}
