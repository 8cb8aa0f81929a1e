package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/subject"
)

// maxIdleUpstream is how many idle connections the default transport
// keeps to the upstream: more than the concurrent requests of a busy
// proxy, so that a request finds one ready instead of dialling.
const maxIdleUpstream = 512

// ProxyOptions configure a Proxy. Pseudonymizer and Logger are required.
type ProxyOptions struct {
	// Pseudonymizer turns client identities into subjects. Required.
	Pseudonymizer *subject.Pseudonymizer
	// Logger receives the middleware's decisions and upstream failures.
	// Required.
	Logger *slog.Logger
	// Metrics, when set, counts the proxy's requests and decisions.
	// Default: nil.
	Metrics *Metrics
	// Fallback is the store of the local fallback limiter, which decides
	// for the policies whose failure mode is local while lim cannot
	// (with proxy.local_share of their limits). The caller owns it and
	// may share it between Proxies, such as those of successive
	// generations of a reloaded config (keys carry the policy revision).
	// Required when a policy's failure mode is local.
	Fallback sluice.Store
	// Transport carries requests to the upstream. Default: a clone of
	// http.DefaultTransport that ignores the HTTP_PROXY environment and
	// keeps up to 512 idle connections to the upstream.
	Transport http.RoundTripper
}

// Proxy is the rate-limiting reverse proxy of sluice serve: httplimit's
// middleware, one route per proxy.routes entry, in front of an
// httputil.ReverseProxy to proxy.upstream.
//
// An admitted request reaches the upstream as the client sent it (method,
// path, query, body, headers and Host), minus the hop-by-hop fields, with
// X-Forwarded-For/-Host/-Proto set as below; the upstream's answer comes
// back as it is, plus the RateLimit fields. A limited request is answered
// by the proxy (429, Retry-After, a problem body) and never reaches the
// upstream. A path no route matches passes unlimited. An upstream that
// cannot be reached is a 502 with a problem body.
//
// X-Forwarded-For carries the socket peer appended to the chain only when
// the peer is a trusted proxy; from any other peer the chain it sent is
// dropped, so the upstream sees exactly the address sluice limited by or
// a chain every hop of which was vouched for. X-Forwarded-Host and
// X-Forwarded-Proto (and Forwarded) from a trusted peer are kept; from
// others they are replaced by what this hop saw (Forwarded: dropped).
//
// Safe for concurrent use. Close releases the idle upstream
// connections.
type Proxy struct {
	handler   http.Handler
	trusted   *subject.TrustedProxies
	log       *slog.Logger
	metrics   *Metrics
	transport http.RoundTripper
}

// subject kinds of proxy.routes[].subject.
const (
	subjectIP          = "ip"
	subjectIPUserAgent = "ip+user_agent"
	subjectHeader      = "header:"
)

// NewProxy returns the proxy of cfg over lim, whose policies are the
// config's.
func NewProxy(cfg *config.Proxy, lim *sluice.Limiter, opts ProxyOptions) (*Proxy, error) {
	switch {
	case cfg == nil:
		return nil, errors.New("server: NewProxy: config is nil")
	case lim == nil:
		return nil, errors.New("server: NewProxy: limiter is nil")
	case opts.Pseudonymizer == nil:
		return nil, errors.New("server: NewProxy: pseudonymizer is nil")
	case opts.Logger == nil:
		return nil, errors.New("server: NewProxy: logger is nil")
	}
	upstream, err := url.Parse(cfg.Upstream)
	if err != nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
		return nil, fmt.Errorf("server: NewProxy: upstream %q: must be an http:// or https:// URL with a host", cfg.Upstream)
	}
	trusted, err := subject.ParseTrustedProxies(cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("server: NewProxy: %w", err)
	}
	p := &Proxy{trusted: trusted, log: opts.Logger, metrics: opts.Metrics, transport: opts.Transport}
	if p.transport == nil {
		p.transport = upstreamTransport()
	}
	mopts := httplimit.Options{
		Pseudonymizer:  opts.Pseudonymizer,
		TrustedProxies: cfg.TrustedProxies,
		Logger:         opts.Logger,
		Deadline:       cfg.DecisionTimeout,
	}
	for i, r := range cfg.Routes {
		rt := httplimit.Route{
			Operation:  r.Match.Operation(),
			Methods:    r.Match.Methods,
			PathPrefix: r.Match.PathPrefix,
			Policies:   r.Policies,
			Shadow:     r.Shadow,
		}
		switch name, isHeader := strings.CutPrefix(r.Subject, subjectHeader); {
		case r.Subject == subjectIP:
			rt.Sources = []httplimit.Source{httplimit.FromIP}
		case r.Subject == subjectIPUserAgent:
			// Without a User-Agent, the address alone.
			rt.Sources = []httplimit.Source{httplimit.FromIPUserAgent, httplimit.FromIP}
		case isHeader && name != "":
			// Without the header, the address. The value is trusted as
			// sent (see README): a client that varies it varies its budget.
			rt.Sources = []httplimit.Source{httplimit.FromAPIKey, httplimit.FromIP}
			rt.APIKeyHeader = name
		default:
			return nil, fmt.Errorf("server: NewProxy: routes[%d].subject %q: must be ip, ip+user_agent or header:<Name>", i, r.Subject)
		}
		mopts.Routes = append(mopts.Routes, rt)
	}
	if mopts.Fallback, err = localFallback(lim, cfg, opts.Fallback); err != nil {
		return nil, err
	}
	if p.metrics != nil {
		mopts.OnDecision = func(_ *http.Request, d httplimit.Decision) { p.metrics.onProxyDecision(d) }
	}
	mw, err := httplimit.NewMiddleware(lim, mopts)
	if err != nil {
		return nil, fmt.Errorf("server: NewProxy: %w", err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Host = pr.In.Host // the client's request, as it was sent
			p.setForwarded(pr)
		},
		Transport:    p.transport,
		ErrorLog:     slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
		ErrorHandler: p.upstreamFailed,
	}
	p.handler = mw.Handler(rp)
	return p, nil
}

// upstreamTransport is the default ProxyOptions.Transport.
func upstreamTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // the upstream is named in the config; no detour
	// One upstream takes every request: keep as many idle connections
	// to it as callers come at once. The default keeps 2, so under
	// concurrency nearly every request dialled a new connection (and
	// left one in TIME_WAIT): 4x the proxy's CPU per request.
	t.MaxIdleConns, t.MaxIdleConnsPerHost = maxIdleUpstream, maxIdleUpstream
	return t
}

// localFallback is the limiter over store that decides for lim's local
// policies while lim cannot; nil when no policy's failure mode is local.
func localFallback(lim *sluice.Limiter, cfg *config.Proxy, store sluice.Store) (*sluice.Limiter, error) {
	if !needsFallback(lim) {
		return nil, nil
	}
	if store == nil {
		return nil, errors.New("server: NewProxy: ProxyOptions.Fallback is nil: a policy's failure mode is local, and its local fallback needs a store")
	}
	fb, err := httplimit.LocalFallback(lim, store, cfg.LocalShare, sluice.Options{})
	if err != nil {
		return nil, fmt.Errorf("server: NewProxy: %w", err)
	}
	return fb, nil
}

func needsFallback(lim *sluice.Limiter) bool {
	for _, id := range lim.Policies() {
		if p, _ := lim.Policy(id); p.FailureMode == sluice.FailLocal {
			return true
		}
	}
	return false
}

// ServeHTTP limits r and, when admitted, forwards it to the upstream.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.metrics == nil {
		p.handler.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	p.handler.ServeHTTP(sw, r)
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	p.metrics.countRequest("proxy", sw.status)
}

// Close releases the idle upstream connections (not the Fallback store,
// which its caller owns). The Proxy must not be used afterwards.
func (p *Proxy) Close() error {
	if t, ok := p.transport.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
	return nil
}

// setForwarded sets the X-Forwarded-* fields of the outbound request (see
// Proxy). Rewrite has already removed the inbound ones from pr.Out.
func (p *Proxy) setForwarded(pr *httputil.ProxyRequest) {
	in, out := pr.In.Header, pr.Out.Header
	peer, err := netip.ParseAddrPort(pr.In.RemoteAddr)
	trusted := err == nil && p.trusted.Contains(peer.Addr().Unmap())
	if trusted {
		if v := in.Values("X-Forwarded-For"); len(v) > 0 {
			out["X-Forwarded-For"] = append([]string(nil), v...)
		}
	}
	pr.SetXForwarded() // appends the peer; sets Host and Proto to this hop's
	if !trusted {
		// Client addresses an untrusted peer claims for itself: an
		// upstream that believes one would key on a spoofed address.
		for _, name := range []string{"X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip"} {
			out.Del(name)
		}
		return
	}
	for _, name := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v := in.Values(name); len(v) > 0 {
			out[name] = append([]string(nil), v...)
		}
	}
	if v := in.Values("Forwarded"); len(v) > 0 {
		hop := peer.Addr().Unmap()
		node := hop.String()
		if hop.Is6() {
			node = `"[` + node + `]"`
		}
		out["Forwarded"] = append(append([]string(nil), v...), "for="+node)
	}
}

// problem502 is the body of a 502: the upstream could not be reached or
// broke off its answer.
const problem502 = `{"type":"about:blank","title":"Bad Gateway","status":502,"detail":"The upstream did not answer."}` + "\n"

// upstreamFailed answers a request the upstream did not answer: 502 with
// a problem body, logged without the client's address or path.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	level := slog.LevelWarn
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		level = slog.LevelDebug // the client went away
	}
	p.log.Log(r.Context(), level, "proxy: upstream failed", slog.String("method", r.Method), slog.String("err", err.Error()))
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(problem502)))
	w.WriteHeader(http.StatusBadGateway)
	io.WriteString(w, problem502)
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (sw *statusWriter) WriteHeader(code int) {
	if sw.status == 0 && code >= 200 {
		sw.status = code
	}
	sw.ResponseWriter.WriteHeader(code)
}

func (sw *statusWriter) Write(b []byte) (int, error) {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	return sw.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (flushes, upgrades) reach the
// connection.
func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }
