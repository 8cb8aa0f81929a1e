package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
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

	cfg := config.Default()
	source := "the built-in example config"
	if path != "" {
		if cfg, err = loadConfig(path); err != nil {
			return err
		}
		source = path
	}
	if err := unsupported(cfg); err != nil {
		return err
	}
	if err := preflight(cfg, a.getenv, path); err != nil {
		return err
	}
	pseud, err := a.pseudonymizer(cfg, log)
	if err != nil {
		return err
	}
	tokens, err := a.checkAPITokens(cfg, log)
	if err != nil {
		return err
	}
	tlsConf, err := tlsConfig(cfg)
	if err != nil {
		return err
	}
	for _, p := range cfg.Policies {
		if p.NearCache {
			log.Warn("near_cache is not implemented yet: every check asks the store", "policy", p.ID)
		}
	}

	ids := make([]string, len(cfg.Policies))
	for i, p := range cfg.Policies {
		ids[i] = p.ID
	}
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	metrics, err := server.NewMetrics(reg, ids)
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}

	st, err := newStore(ctx, cfg, a.clock, a.getenv, log)
	if err != nil {
		return err
	}
	defer st.close()
	lim, err := sluice.New(metrics.InstrumentStore(st.store, cfg.Store.Type, a.clock), cfg.SluicePolicies(), sluice.Options{})
	if err != nil {
		return err
	}
	handler, err := server.New(lim, pseud, log, server.Options{Ready: st.ready, Clock: a.clock, Metrics: metrics, Tokens: tokens})
	if err != nil {
		return err
	}
	servers := []*http.Server{{
		Handler:           handler,
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
		proxy, err := server.NewProxy(cfg.Proxy, lim, server.ProxyOptions{Pseudonymizer: pseud, Logger: log, Metrics: metrics, Clock: a.clock})
		if err != nil {
			return err
		}
		defer proxy.Close()
		// No read or write timeout: uploads, downloads and streams to and
		// from the upstream may take as long as they take.
		servers = append(servers, &http.Server{
			Handler:           proxy,
			ReadHeaderTimeout: 5 * time.Second,
			IdleTimeout:       60 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		})
		addrs = append(addrs, cfg.Proxy.Listen)
		fields = append(fields, "proxy.listen")
	}
	lns := make([]net.Listener, len(servers))
	for i, addr := range addrs {
		if lns[i], err = net.Listen("tcp", addr); err != nil {
			for _, ln := range lns[:i] {
				ln.Close()
			}
			return fmt.Errorf("serve: %s %q: %w", fields[i], addr, err)
		}
	}
	served := make(chan error, len(servers))
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
	if cfg.Proxy != nil {
		log.Info("proxy listening", "addr", "http://"+lns[1].Addr().String(), "upstream", cfg.Proxy.Upstream, "routes", len(cfg.Proxy.Routes))
	}
	// Last: once this line is out, every listener is serving.
	log.Info("listening", "addr", scheme+lns[0].Addr().String(), "config", source, "store", cfg.Store.Type, "policies", strings.Join(ids, ","))

	var failed error
	select {
	case err := <-served:
		failed = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", shutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(shutdownCtx); err != nil && failed == nil {
			failed = fmt.Errorf("serve: shut down: %w", err)
		}
	}
	if failed != nil {
		return failed
	}
	for range servers {
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	log.Info("stopped")
	return nil
}

// unsupported refuses config sections this binary parses but cannot serve
// yet, rather than ignoring them.
func unsupported(cfg *config.Config) error {
	if cfg.Envoy != nil {
		return fmt.Errorf("envoy (line %d): the Envoy rate-limit service is not supported yet by this binary; remove the section", cfg.Line("envoy"))
	}
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
