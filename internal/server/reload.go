package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rlqs"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/wiring"
	"github.com/sluicehq/sluice/subject"
)

// restartOnly reports a setting that differs between old and new and
// that a reload cannot change: listen addresses, which services listen,
// and the store.
func restartOnly(prev, next *config.Config) error {
	changed := func(field string, a, b any) error {
		return fmt.Errorf("%s changed from %v to %v (line %d): listen addresses, the proxy and envoy sections' presence, the store, telemetry and, with envoy.rlqs, the HMAC keys are fixed until sluice restarts; restart it to apply", field, a, b, next.Line(field))
	}
	switch {
	case prev.Server.Listen != next.Server.Listen:
		return changed("server.listen", strconv.Quote(prev.Server.Listen), strconv.Quote(next.Server.Listen))
	case !reflect.DeepEqual(prev.Store, next.Store):
		return changed("store", "its old settings", "new ones")
	case (prev.Proxy == nil) != (next.Proxy == nil):
		return changed("proxy", present(prev.Proxy != nil), present(next.Proxy != nil))
	case prev.Proxy != nil && prev.Proxy.Listen != next.Proxy.Listen:
		return changed("proxy.listen", strconv.Quote(prev.Proxy.Listen), strconv.Quote(next.Proxy.Listen))
	case prev.Proxy != nil && prev.Proxy.ReadTimeout != next.Proxy.ReadTimeout:
		return changed("proxy.read_timeout", prev.Proxy.ReadTimeout, next.Proxy.ReadTimeout)
	case !reflect.DeepEqual(prev.Server.TLS, next.Server.TLS):
		return changed("server.tls", "its old settings", "new ones")
	case (prev.Envoy == nil) != (next.Envoy == nil):
		return changed("envoy", present(prev.Envoy != nil), present(next.Envoy != nil))
	case prev.Envoy != nil && prev.Envoy.Listen != next.Envoy.Listen:
		return changed("envoy.listen", strconv.Quote(prev.Envoy.Listen), strconv.Quote(next.Envoy.Listen))
	case prev.Envoy != nil && (len(prev.Envoy.Configs) == 0) != (len(next.Envoy.Configs) == 0):
		return changed("envoy.configs", present(len(prev.Envoy.Configs) > 0), present(len(next.Envoy.Configs) > 0))
	case prev.Envoy != nil && (prev.Envoy.RLQS == nil) != (next.Envoy.RLQS == nil):
		return changed("envoy.rlqs", present(prev.Envoy.RLQS != nil), present(next.Envoy.RLQS != nil))
	case next.Envoy != nil && next.Envoy.RLQS != nil && !reflect.DeepEqual(prev.Subjects.HMACKeys, next.Subjects.HMACKeys):
		// The quota service names a bucket by its pseudonym under the
		// keys it started with, for the bucket's life (docs/rlqs.md,
		// "Key rotation").
		return changed("subjects.hmac_keys", "its old keys", "new ones")
	case !reflect.DeepEqual(prev.Telemetry, next.Telemetry):
		return changed("telemetry", "its old settings", "new ones")
	}
	return nil
}

func present(b bool) string {
	if b {
		return "present"
	}
	return "absent"
}

// generation is one configuration being served: everything a reload
// replaces. A request holds a reference to the generation it started on
// (acquire), so a retired one is closed only after its last request.
type generation struct {
	n        int64
	loaded   *loaded
	loadedAt time.Time
	api      http.Handler
	proxy    *Proxy       // nil without a proxy section
	rls      *rls.State   // nil without Envoy rules files
	rlqs     *rlqs.Config // nil without envoy.rlqs
	pseud    *subject.Pseudonymizer

	mu       sync.Mutex
	inflight int
	retired  bool
}

func (g *generation) acquire() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.retired {
		return false
	}
	g.inflight++
	return true
}

func (g *generation) release() {
	g.mu.Lock()
	g.inflight--
	done := g.retired && g.inflight == 0
	g.mu.Unlock()
	if done {
		g.close()
	}
}

// retire marks g replaced; it is closed once no request holds it.
func (g *generation) retire() {
	g.mu.Lock()
	g.retired = true
	done := g.inflight == 0
	g.mu.Unlock()
	if done {
		g.close()
	}
}

func (g *generation) close() {
	if g.proxy != nil {
		g.proxy.Close()
	}
}

// reloadMetrics count reloads:
//
//   - sluice_config_reloads_total{result}: reload attempts, by result
//     (success, failure).
//   - sluice_config_generation: the generation serving (1 at start).
//   - sluice_config_last_reload_success_timestamp_seconds: when the
//     serving generation was loaded, in Unix seconds.
//   - sluice_config_warnings: what the serving config holds that loads
//     but never acts (an Envoy rule that can never match, a replaces
//     naming none: rules.Config.Warnings; an RLQS matcher that can never
//     match: config.Config.Warnings), each logged once as it loads.
type reloadMetrics struct {
	reloads    *prometheus.CounterVec
	generation prometheus.Gauge
	lastOK     prometheus.Gauge
	warnings   prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) (*reloadMetrics, error) {
	m := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_config_reloads_total",
			Help: "Config reload attempts (SIGHUP or a watched file changed), by result.",
		}, []string{"result"}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_generation",
			Help: "The generation of the config serving: 1 at start, one more per successful reload.",
		}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_last_reload_success_timestamp_seconds",
			Help: "When the config serving was loaded, in seconds since the Unix epoch.",
		}),
		warnings: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_warnings",
			Help: "What the serving config holds that loads but never acts: Envoy rules and RLQS matchers that can never match, replaces naming no rule (sluice validate lists them).",
		}),
	}
	for _, c := range []prometheus.Collector{m.reloads, m.generation, m.lastOK, m.warnings} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m, nil
}

// warn logs each warning of l, the config now serving, once, and counts
// them.
func (m *reloadMetrics) warn(log *slog.Logger, l *loaded) {
	for _, w := range l.warnings {
		log.Warn("config: loads, but never acts (sluice validate --strict refuses it)", "warning", w)
	}
	m.warnings.Set(float64(len(l.warnings)))
}

// reloader owns the serving generation and replaces it.
type reloader struct {
	path     string
	getenv   func(string) string
	clock    sluice.Clock
	log      *slog.Logger
	store    sluice.Store // instrumented; shared by every generation
	fallback sluice.Store // of the proxy's local fallbacks; nil without a proxy
	ready    []Check
	info     StoreInfo
	metrics  *Metrics
	rlsM     *rls.Metrics
	reloadM  *reloadMetrics
	rlsSvc   *rls.Service // nil without Envoy rules files
	rlqsM    *rlqs.Metrics
	rlqsSvc  *rlqs.Service // nil without envoy.rlqs
	tracing  *tracing      // nil without a telemetry section

	cur  atomic.Pointer[generation]
	last atomic.Pointer[ReloadStatus]
	// statusMu makes a successful reload's new generation and its
	// ReloadStatus one step for status: /v1/config never shows the new
	// generation with the previous reload's result.
	statusMu sync.Mutex
	// lastFailure identifies the last failed reload logged (failureKey);
	// "" after a success. Only the goroutine that reloads touches it.
	lastFailure string
}

// failureKey identifies a failed reload by its reason and what the
// config's files held.
func (r *reloader) failureKey(err error) string {
	fp := ""
	if r.path != "" {
		fp = newWatchSet(r.path, r.cur.Load().loaded.cfg).fingerprint()
	}
	return fp + "\x00" + err.Error()
}

// build makes a generation of l: its Limiters and the Envoy service's
// state from the wiring, the check API and the proxy around them.
func (r *reloader) build(l *loaded, n int64) (*generation, error) {
	cfg := l.cfg
	w, err := wiring.Build(cfg, l.envoy, wiring.BuildOptions{Store: r.store, Clock: r.clock, Getenv: r.getenv, Log: r.log, TracerProvider: r.tracing.provider(), Count: r.metrics.count, Settled: r.metrics.settled, OnLocalQuota: r.metrics.countLocal})
	if err != nil {
		return nil, err
	}
	tokens, err := checkAPITokens(cfg, r.getenv, r.log)
	if err != nil {
		return nil, err
	}
	g := &generation{n: n, loaded: l, loadedAt: r.clock.Now(), rls: w.RLS, rlqs: w.RLQS, pseud: w.Pseudonymizer}
	if g.api, err = New(w.Limiter, w.Pseudonymizer, r.log, Options{Envoy: w.Envoy, EnvoyState: w.RLS, FailureModes: w.FailureModes, Ready: r.ready, DecisionTimeout: cfg.Server.DecisionTimeout, Clock: r.clock, Metrics: r.metrics, ConfigStatus: r.status, Tokens: tokens, Store: r.info, ConfigOverrides: w.Overrides, Core: w.Core,
		RLQS: w.RLQS, RLQSBuckets: r.rlqsBuckets(w.RLQS)}); err != nil {
		return nil, err
	}
	if cfg.Proxy != nil {
		if g.proxy, err = NewProxy(cfg.Proxy, w.Limiter, ProxyOptions{FailureModes: w.FailureModes, Pseudonymizer: w.Pseudonymizer, Logger: r.log, Metrics: r.metrics, Fallback: r.fallback, Transport: r.tracing.transport(upstreamTransport())}); err != nil {
			return nil, err
		}
		if api, ok := g.api.(*Server); ok {
			api.proxySubject = func(route int, ip, header string) ([]string, string, []string, error) {
				return wiring.ProxySubject(cfg.Proxy, w.Pseudonymizer, route, ip, header)
			}
		}
	}
	return g, nil
}

// observe makes g's Limiters the source of sluice_overrides, and starts
// sluice_local_quota_* at zero for each of their local-quota policies,
// so every series exists from the first scrape (the Limiters tell the
// counts themselves: OnLocalQuota).
func (r *reloader) observe(g *generation) {
	if r.metrics == nil {
		return
	}
	var lims []*sluice.Limiter
	if srv, ok := g.api.(*Server); ok {
		r.metrics.countOverrides(srv.overrideCounts)
		lims = append(lims, srv.lim)
	}
	if g.rls != nil {
		lims = append(lims, g.rls.Limiter)
	}
	for _, l := range lims {
		if l == nil {
			continue
		}
		for _, id := range l.Policies() {
			if p, _ := l.Policy(id); p.LocalQuota.Enabled {
				r.metrics.countLocal(id, 0, 0, 0, 0)
			}
		}
	}
}

// status answers GET /v1/config.
func (r *reloader) status() ConfigStatus {
	r.statusMu.Lock()
	g, last := r.cur.Load(), r.last.Load()
	r.statusMu.Unlock()
	s := ConfigStatus{Generation: g.n, Hash: g.loaded.hash, LoadedAt: g.loadedAt, Files: g.loaded.files, LastReload: last, Listen: listeners(g.loaded.cfg)}
	if s.Files == nil {
		s.Files = []string{}
	}
	return s
}

// reload loads the config again and, when it is valid and differs (or
// force is set), serves it from now on. Otherwise the serving generation
// stays and the reason is logged and counted.
func (r *reloader) reload(trigger string, force bool) {
	old := r.cur.Load()
	l, err := load(r.path, r.getenv)
	if err == nil && !force && l.hash == old.loaded.hash {
		// An event that changed nothing sluice reads; or the files are back
		// to what is serving after a failed reload, which /v1/config says.
		if last := r.last.Load(); last != nil && last.Result == "failure" {
			r.last.Store(&ReloadStatus{Result: "unchanged", Trigger: trigger, At: r.clock.Now()})
		}
		return
	}
	if err == nil {
		err = restartOnly(old.loaded.cfg, l.cfg)
	}
	var g *generation
	if err == nil {
		g, err = r.build(l, old.n+1)
	}
	if err == nil {
		if err = r.swapEnvoy(g); err != nil {
			g.close()
		}
	}
	at := r.clock.Now()
	if err != nil {
		r.reloadM.reloads.WithLabelValues("failure").Inc()
		r.last.Store(&ReloadStatus{Result: "failure", Trigger: trigger, At: at, Error: err.Error()})
		// One line per distinct failure: the same reason for the same
		// files (a second SIGHUP before the fix) is not news.
		seen := r.failureKey(err)
		if seen == r.lastFailure {
			r.log.Debug("config reload failed again, for the same reason", "trigger", trigger, "generation", old.n)
			return
		}
		r.lastFailure = seen
		r.log.Error("config reload failed: still serving the previous config", "trigger", trigger, "generation", old.n, "reason", err)
		return
	}
	r.lastFailure = ""
	r.statusMu.Lock()
	r.cur.Store(g)
	r.last.Store(&ReloadStatus{Result: "success", Trigger: trigger, At: at})
	r.statusMu.Unlock()
	r.observe(g)
	r.metrics.SetPolicies(wiring.PolicyIDs(l.cfg, l.envoy))
	old.retire()
	r.reloadM.reloads.WithLabelValues("success").Inc()
	r.reloadM.generation.Set(float64(g.n))
	r.reloadM.lastOK.Set(float64(at.Unix()))
	r.reloadM.warn(r.log, l)
	attrs := []any{"trigger", trigger, "generation", g.n, "hash", l.hash[:min(12, len(l.hash))], "policies", len(l.cfg.Policies)}
	if l.envoy != nil {
		attrs = append(attrs, "envoy_domains", len(l.envoy.Domains()), "envoy_rules", len(l.envoy.Rules()))
	}
	r.log.Info("config reloaded", attrs...)
}

// listeners says where each service of cfg listens and which field, or
// default, said so.
func listeners(cfg *config.Config) []Listener {
	source := func(field string) string {
		if cfg.Line(field) == 0 {
			return "default"
		}
		return field
	}
	ls := []Listener{{Service: "check_api", Addr: cfg.Server.Listen, Source: source("server.listen")}}
	if cfg.Proxy != nil {
		ls = append(ls, Listener{Service: "proxy", Addr: cfg.Proxy.Listen, Source: source("proxy.listen")})
	}
	if cfg.Envoy != nil {
		ls = append(ls, Listener{Service: "envoy", Addr: cfg.Envoy.Listen, Source: "envoy.listen"})
	}
	return ls
}

// swapEnvoy hands g's Envoy services' states to the running services.
func (r *reloader) swapEnvoy(g *generation) error {
	if g.rls != nil {
		if err := r.rlsSvc.Swap(g.rls); err != nil {
			return err
		}
	}
	if g.rlqs != nil {
		return r.rlqsSvc.Swap(*g.rlqs)
	}
	return nil
}

// rlqsPlans reads the tenant plans of the serving generation's Limiter:
// the quota service's buckets' plans are among them.
func (r *reloader) rlqsPlans(ctx context.Context) ([]sluice.Override, error) {
	srv, release := r.current()
	defer release()
	if srv == nil || srv.lim == nil {
		return nil, nil
	}
	return srv.lim.Overrides(ctx)
}

// rlqsBuckets lists the quota service's buckets for a generation of cfg
// (nil without envoy.rlqs). The service is made after the first
// generation and before any request: read when asked.
func (r *reloader) rlqsBuckets(cfg *rlqs.Config) func(limit int) []rlqs.BucketView {
	if cfg == nil {
		return nil
	}
	return func(limit int) []rlqs.BucketView {
		if r.rlqsSvc == nil {
			return nil
		}
		return r.rlqsSvc.Buckets(limit)
	}
}

// serveWith serves an HTTP request with the handler pick chooses from the
// current generation, holding that generation until the answer is done.
func (r *reloader) serveWith(pick func(*generation) http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		for {
			g := r.cur.Load()
			if !g.acquire() {
				continue // retired just now: its successor is already current
			}
			defer g.release()
			pick(g).ServeHTTP(w, req)
			return
		}
	})
}

// current returns the check API of the generation serving, held until
// release is called: the gRPC check service's (grpccheck.go) as
// serveWith is the HTTP API's.
func (r *reloader) current() (srv *Server, release func()) {
	for {
		g := r.cur.Load()
		if g.acquire() {
			srv, _ = g.api.(*Server) // New's, always
			return srv, g.release
		}
	}
}

// checkAPITokens returns server.auth's tokens for Options, warning when
// the check API is open on an address other hosts can reach.
func checkAPITokens(cfg *config.Config, getenv func(string) string, log *slog.Logger) ([]Token, error) {
	resolved, err := cfg.Tokens(getenv)
	if err != nil {
		return nil, err
	}
	if len(resolved) == 0 {
		if !loopback(cfg.Server.Listen) {
			log.Warn("server.auth is not configured and server.listen is not a loopback address: anyone who can reach it can spend and refund any subject's budget and read the dashboard at /ui; configure server.auth.tokens", "listen", cfg.Server.Listen)
		}
		return nil, nil
	}
	tokens := make([]Token, len(resolved))
	for i, t := range resolved {
		tokens[i] = Token{ID: t.ID, Secret: t.Secret, Scopes: t.Scopes}
	}
	return tokens, nil
}

// loopback reports whether a listen address accepts only local
// connections.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.IsLoopback()
}
