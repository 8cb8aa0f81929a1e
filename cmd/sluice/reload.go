package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoyconf"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/server"
)

// loaded is a parsed and validated configuration: the config file and,
// with an envoy section, the rules files it names.
type loaded struct {
	cfg   *config.Config
	envoy *envoyconf.Config // nil without an envoy section
	hash  string            // SHA-256 over every file read
	files []string          // config file first; nil for the built-in example
}

// load reads the config at path (the built-in example when path is "")
// and the Envoy rules files it names, and checks what serve would refuse
// (see preflight), reporting every problem it finds. Relative
// envoy.configs patterns are relative to the config file's directory.
func load(path string, getenv func(string) string) (*loaded, error) {
	if path == "" {
		cfg := config.Default()
		return &loaded{cfg: cfg, hash: "built-in"}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := parseConfig(path, data)
	if cfg == nil {
		return nil, err // unreadable, or not decodable: nothing more to check
	}
	// What serve would refuse after parsing, reported even when the file
	// breaks rules too: secrets missing from the environment, a Redis URL
	// the client rejects, TLS files that do not load.
	var all errorList
	for _, e := range []error{err, preflight(cfg, getenv, path)} {
		var list errorList
		switch {
		case e == nil:
		case errors.As(e, &list):
			all = append(all, list...)
		default:
			all = append(all, e)
		}
	}
	switch len(all) {
	case 0:
	case 1:
		return nil, all[0]
	default:
		return nil, all
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s", len(data), data)
	l := &loaded{cfg: cfg, files: []string{path}}
	if cfg.Envoy != nil {
		if l.envoy, err = envoyconf.Load(envoyPatterns(cfg, path)); err != nil {
			return nil, fmt.Errorf("envoy.configs (%s line %d): %w", path, cfg.Line("envoy.configs"), err)
		}
		h.Write([]byte(l.envoy.Hash()))
		l.files = append(l.files, l.envoy.Files()...)
	}
	l.hash = hex.EncodeToString(h.Sum(nil))
	return l, nil
}

// envoyPatterns returns cfg's envoy.configs with relative patterns
// joined to the directory of the config file at path.
func envoyPatterns(cfg *config.Config, path string) []string {
	pats := make([]string, len(cfg.Envoy.Configs))
	for i, p := range cfg.Envoy.Configs {
		if !filepath.IsAbs(p) && path != "" {
			p = filepath.Join(filepath.Dir(path), p)
		}
		pats[i] = p
	}
	return pats
}

// watchDirs are the directories whose changes may change what load
// reads: the config file's and those of the envoy.configs patterns.
// Watching directories, not files, sees editors that replace a file and
// Kubernetes ConfigMap updates, which swap the ..data symlink.
func (l *loaded) watchDirs(path string) []string {
	if path == "" {
		return nil
	}
	set := map[string]bool{filepath.Dir(path): true}
	if l.cfg.Envoy != nil {
		for _, p := range envoyPatterns(l.cfg, path) {
			set[filepath.Dir(p)] = true
		}
	}
	dirs := make([]string, 0, len(set))
	for d := range set {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	return dirs
}

// restartOnly reports a setting that differs between old and new and
// that a reload cannot change: listen addresses, which services listen,
// and the store.
func restartOnly(prev, next *config.Config) error {
	changed := func(field string, a, b any) error {
		return fmt.Errorf("%s changed from %v to %v (line %d): listen addresses, the proxy and envoy sections' presence and the store are fixed until sluice restarts; restart it to apply", field, a, b, next.Line(field))
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
	proxy    *server.Proxy // nil without a proxy section
	rls      *rls.State    // nil without an envoy section

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
type reloadMetrics struct {
	reloads    *prometheus.CounterVec
	generation prometheus.Gauge
	lastOK     prometheus.Gauge
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
	}
	for _, c := range []prometheus.Collector{m.reloads, m.generation, m.lastOK} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m, nil
}

// reloader owns the serving generation and replaces it.
type reloader struct {
	a       *app
	path    string
	log     *slog.Logger
	store   sluice.Store // instrumented; shared by every generation
	ready   []server.Check
	info    server.StoreInfo
	metrics *server.Metrics
	rlsM    *rls.Metrics
	reloadM *reloadMetrics
	rlsSvc  *rls.Service // nil without an envoy section

	cur  atomic.Pointer[generation]
	last atomic.Pointer[server.ReloadStatus]
}

// build makes a generation of l.
func (r *reloader) build(l *loaded, n int64) (*generation, error) {
	cfg := l.cfg
	pseud, err := r.a.pseudonymizer(cfg, r.log)
	if err != nil {
		return nil, err
	}
	lim, err := sluice.New(r.store, cfg.SluicePolicies(), sluice.Options{})
	if err != nil {
		return nil, err
	}
	tokens, err := r.a.checkAPITokens(cfg, r.log)
	if err != nil {
		return nil, err
	}
	g := &generation{n: n, loaded: l, loadedAt: r.a.clock.Now()}
	if g.api, err = server.New(lim, pseud, r.log, server.Options{Ready: r.ready, DecisionTimeout: cfg.Server.DecisionTimeout, Clock: r.a.clock, Metrics: r.metrics, ConfigStatus: r.status, Tokens: tokens, Store: r.info}); err != nil {
		return nil, err
	}
	if cfg.Proxy != nil {
		if g.proxy, err = server.NewProxy(cfg.Proxy, lim, server.ProxyOptions{Pseudonymizer: pseud, Logger: r.log, Metrics: r.metrics, Clock: r.a.clock}); err != nil {
			return nil, err
		}
	}
	if l.envoy != nil {
		elim, err := sluice.New(r.store, l.envoy.Policies(), sluice.Options{})
		if err != nil {
			g.close()
			return nil, fmt.Errorf("envoy rules: %w", err)
		}
		g.rls = &rls.State{Rules: l.envoy, Limiter: elim, Pseudonymizer: pseud}
	}
	return g, nil
}

// status answers GET /v1/config.
func (r *reloader) status() server.ConfigStatus {
	g := r.cur.Load()
	s := server.ConfigStatus{Generation: g.n, Hash: g.loaded.hash, LoadedAt: g.loadedAt, Files: g.loaded.files, LastReload: r.last.Load()}
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
	l, err := load(r.path, r.a.getenv)
	if err == nil && !force && l.hash == old.loaded.hash {
		// An event that changed nothing sluice reads; or the files are back
		// to what is serving after a failed reload, which /v1/config says.
		if last := r.last.Load(); last != nil && last.Result == "failure" {
			r.last.Store(&server.ReloadStatus{Result: "unchanged", Trigger: trigger, At: r.a.clock.Now()})
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
	if err == nil && g.rls != nil {
		err = r.rlsSvc.Swap(g.rls)
		if err != nil {
			g.close()
		}
	}
	at := r.a.clock.Now()
	if err != nil {
		r.reloadM.reloads.WithLabelValues("failure").Inc()
		r.last.Store(&server.ReloadStatus{Result: "failure", Trigger: trigger, At: at, Error: err.Error()})
		r.log.Error("config reload failed: still serving the previous config", "trigger", trigger, "generation", old.n, "reason", err)
		return
	}
	r.cur.Store(g)
	r.metrics.SetPolicies(policyIDs(l.cfg))
	old.retire()
	r.reloadM.reloads.WithLabelValues("success").Inc()
	r.reloadM.generation.Set(float64(g.n))
	r.reloadM.lastOK.Set(float64(at.Unix()))
	r.last.Store(&server.ReloadStatus{Result: "success", Trigger: trigger, At: at})
	attrs := []any{"trigger", trigger, "generation", g.n, "hash", l.hash[:min(12, len(l.hash))], "policies", len(l.cfg.Policies)}
	if l.envoy != nil {
		attrs = append(attrs, "envoy_domains", len(l.envoy.Domains()), "envoy_rules", len(l.envoy.Rules()))
	}
	r.log.Info("config reloaded", attrs...)
}

func policyIDs(cfg *config.Config) []string {
	ids := make([]string, len(cfg.Policies))
	for i, p := range cfg.Policies {
		ids[i] = p.ID
	}
	return ids
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

// watcher reports changes in a set of directories. A nil *watcher
// reports nothing.
type watcher struct {
	w       *fsnotify.Watcher
	watched map[string]bool
	log     *slog.Logger
}

func newWatcher(log *slog.Logger) (*watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	return &watcher{w: w, watched: map[string]bool{}, log: log}, nil
}

// add watches dirs not yet watched; a directory that cannot be watched
// is logged and skipped (SIGHUP still reloads).
func (w *watcher) add(dirs []string) {
	if w == nil {
		return
	}
	for _, d := range dirs {
		if w.watched[d] {
			continue
		}
		if err := w.w.Add(d); err != nil {
			w.log.Warn("cannot watch a config directory: changes there need a SIGHUP", "dir", d, "reason", err)
			continue
		}
		w.watched[d] = true
	}
}

func (w *watcher) events() <-chan fsnotify.Event {
	if w == nil {
		return nil
	}
	return w.w.Events
}

func (w *watcher) errors() <-chan error {
	if w == nil {
		return nil
	}
	return w.w.Errors
}

func (w *watcher) close() error {
	if w == nil {
		return nil
	}
	return w.w.Close()
}

// reloadDelay is how long the files must be quiet after a change before
// serve reloads: an editor or a ConfigMap update is several events.
const reloadDelay = 200 * time.Millisecond

// watchLoop reloads on SIGHUP (hup) and on changes in the watched
// directories until ctx is done or served reports a server's end, which
// it returns.
func (r *reloader) watchLoop(ctx context.Context, hup <-chan os.Signal, w *watcher, served <-chan error) error {
	var quiet *time.Timer
	var quietC <-chan time.Time
	defer func() {
		if quiet != nil {
			quiet.Stop()
		}
	}()
	for {
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
			return nil
		case <-hup:
			r.log.Info("SIGHUP: reloading the config")
			r.reload("signal", true)
			w.add(r.cur.Load().loaded.watchDirs(r.path))
		case ev, ok := <-w.events():
			if !ok {
				return errors.New("config watcher stopped")
			}
			r.log.Debug("config directory changed", "file", ev.Name, "op", ev.Op.String())
			if quiet == nil {
				quiet = time.NewTimer(reloadDelay)
			} else {
				quiet.Reset(reloadDelay)
			}
			quietC = quiet.C
		case err := <-w.errors():
			r.log.Warn("config watcher", "reason", err)
		case <-quietC:
			quietC = nil
			r.reload("file", false)
			w.add(r.cur.Load().loaded.watchDirs(r.path))
		}
	}
}
