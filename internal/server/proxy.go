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
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/wiring"
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
	// FailureModes are the policies' failure modes (failure_mode), by ID:
	// a route fails closed when one of its policies does, else local when
	// one does, else open. Default: none, every policy fails closed.
	FailureModes map[string]failure.Mode
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
// No spelling reaches the upstream that it may read as a limited route
// or subject while the proxy read it otherwise:
//   - a path servers read differently is answered 400 (a backslash, a
//     NUL or other control byte, raw or encoded, an encoded slash or
//     backslash, %2F or %5C, a # raw or encoded (%23), a dot segment in
//     disguise such as "..;");
//     every other path goes on in normal form, with encoded unreserved
//     characters such as %2E decoded and "//" and dot segments removed,
//     so the upstream reads the path the routes matched (see
//     httplimit.Options.StrictPaths). Routes match case-insensitively,
//     without ;parameters and trailing dots.
//   - a header that spells a route's subject header otherwise, with "_"
//     for "-" (X_Api_Key for X-Api-Key, which CGI, WSGI, Rack and PHP
//     read as the same variable), is dropped; a request that sends the
//     subject header more than once, or a list in it (a comma), which
//     names no one subject, is answered 400.
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
	ips       *subject.IPResolver
	headers   []string // the subject headers of the routes, canonical
	log       *slog.Logger
	metrics   *Metrics
	transport http.RoundTripper
}

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
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: cfg.TrustedProxies})
	if err != nil {
		return nil, fmt.Errorf("server: NewProxy: %w", err)
	}
	p := &Proxy{ips: ips, log: opts.Logger, metrics: opts.Metrics, transport: opts.Transport}
	if p.transport == nil {
		p.transport = upstreamTransport()
	}
	mopts := httplimit.Options{
		Pseudonymizer: opts.Pseudonymizer,
		Logger:        opts.Logger,
		Deadline:      cfg.DecisionTimeout,
		StrictPaths:   true,
	}
	if mopts.Routes, err = p.routes(cfg.Routes, opts.FailureModes, lim); err != nil {
		return nil, err
	}
	if needsFallback(mopts.Routes) {
		if opts.Fallback == nil {
			return nil, errors.New("server: NewProxy: ProxyOptions.Fallback is nil: a policy's failure mode is local, and its local fallback needs a store")
		}
		mopts.Fallback, mopts.LocalShare = opts.Fallback, cfg.LocalShare
	}
	if p.metrics != nil {
		mopts.OnDecision = func(_ *http.Request, d httplimit.Decision) { p.metrics.onProxyDecision(d) }
	}
	mw, err := httplimit.New(lim, mopts)
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
	p.handler = p.screenHeaders(mw.Handler(rp))
	return p, nil
}

// routes maps proxy.routes to the middleware's, each route's operation
// and subject as wiring.ProxyRoute names them (as a plan names its
// clients), and records the subject headers.
func (p *Proxy) routes(cfg []config.Route, modes map[string]failure.Mode, lim *sluice.Limiter) ([]httplimit.Route, error) {
	out := make([]httplimit.Route, 0, len(cfg))
	for i, r := range cfg {
		op, key, err := wiring.ProxyRoute(r, p.ips)
		if err != nil {
			return nil, fmt.Errorf("server: NewProxy: routes[%d].subject: %w", i, err)
		}
		rt := httplimit.Route{
			Operation:   op,
			Methods:     r.Match.Methods,
			PathPrefix:  r.Match.PathPrefix,
			Policies:    r.Policies,
			Subject:     key,
			Shadow:      r.Shadow,
			FailureMode: routeMode(r.Policies, modes),
			Priority:    r.Priority,
		}
		if r.PriorityHeader != "" {
			rt.PriorityFunc = p.priorityFrom(r.PriorityHeader, classes(lim, r.Policies))
		}
		rt.MaxDelay, rt.QueueLimit = r.MaxDelay, int(r.QueueLimit)
		if r.SettleHeader != "" {
			rt.Cost, rt.SettleHeader = max(r.Estimate, 1), r.SettleHeader // settled with the upstream's header as it arrives (httplimit's settleWriter)
		}
		if kind, name := r.SubjectKind(); kind == config.SubjectHeader {
			if name = http.CanonicalHeaderKey(name); !slices.Contains(p.headers, name) {
				p.headers = append(p.headers, name)
			}
		}
		out = append(out, rt)
	}
	return out, nil
}

// classes returns the priority classes the policies ids of lim declare,
// and "default".
func classes(lim *sluice.Limiter, ids []string) []string {
	out := []string{"default"}
	for _, id := range ids {
		p, _ := lim.Policy(id)
		for c := range p.Priorities {
			out = append(out, c)
		}
	}
	return out
}

// priorityFrom returns the class of a request of a route whose class may
// come from header name: its value when the request's peer (the TCP
// connection's, not a forwarded address) is one of proxy.trusted_proxies,
// the gateway that sets it, and the value is one of classes; else ""
// (the route's own Priority). A client that reaches the proxy directly
// cannot name itself critical.
func (p *Proxy) priorityFrom(name string, classes []string) func(*http.Request) string {
	return func(r *http.Request) string {
		v := r.Header.Get(name)
		if v == "" || !slices.Contains(classes, v) {
			return ""
		}
		peer, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !p.ips.Trusts(peer.Addr().Unmap()) {
			return ""
		}
		return v
	}
}

// foldHeader is the name a CGI-style upstream reads header name as: case
// and "_" against "-" do not count.
func foldHeader(name string) string {
	return strings.ReplaceAll(strings.ToLower(name), "_", "-")
}

// problemDuplicate is the body of the 400 for a subject header sent more
// than once or holding a list.
const problemDuplicate = `{"type":"about:blank","title":"Bad Request","status":400,"detail":"A header the rate limit is keyed on is sent more than once, or as a list."}` + "\n"

// screenHeaders wraps next so that no spelling of a route's subject
// header other than its own reaches it (nor the upstream), and a request
// that sends the header more than once is answered 400 (see Proxy).
func (p *Proxy) screenHeaders(next http.Handler) http.Handler {
	if len(p.headers) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name, vals := range r.Header {
			f := foldHeader(name)
			for _, h := range p.headers {
				switch {
				case f != foldHeader(h):
				case name != h:
					delete(r.Header, name)
				case wiring.ListedHeader(vals):
					writeProblem(w, http.StatusBadRequest, problemDuplicate)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
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

// routeMode is the failure mode of a route spending policies: closed
// when one of them fails closed, else local when one fails local, else
// open.
func routeMode(policies []string, modes map[string]failure.Mode) failure.Mode {
	mode := failure.Open
	for _, id := range policies {
		switch modes[id] {
		case failure.Closed:
			return failure.Closed
		case failure.Local:
			mode = failure.Local
		}
	}
	return mode
}

// needsFallback reports whether a route fails local.
func needsFallback(routes []httplimit.Route) bool {
	for _, r := range routes {
		if r.FailureMode == failure.Local {
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
	// The middleware's edge core counts its decision on the server's
	// metrics.
	r = r.WithContext(edge.WithSettled(edge.WithCount(r.Context(), p.metrics.count), p.metrics.settled))
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
	trusted := err == nil && p.ips.Trusts(peer.Addr())
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
	writeProblem(w, http.StatusBadGateway, problem502)
}

// writeProblem answers status with the problem+json body.
func writeProblem(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	io.WriteString(w, body)
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
