// Package httplimit is sluice's net/http middleware. For each request it
// picks the route's policies, resolves who is asking (by default the
// client address behind trusted proxies; a principal or an API key where
// configured), turns that into a pseudonym, asks the Limiter within a
// deadline, and answers:
//
//   - allowed: the request goes on, with RateLimit-Policy and RateLimit
//     header fields (draft-ietf-httpapi-ratelimit-headers);
//   - denied: 429 Too Many Requests, Retry-After, and an RFC 9457 problem
//     of the draft's quota-exceeded type listing the violated policies;
//   - undecidable (store down, deadline passed, reply lost, corrupt
//     state): per the policies' failure mode, 503 with Retry-After (closed),
//     the request goes on (open), or a local limiter holding a share of
//     the limit decides (local).
//
// The raw identity (a principal, an API key, an IP address) is only ever
// hashed: it never reaches the Limiter, a log line or a Decision.
//
// PerIP builds the common case in one call: one policy, per client
// address. NewMiddleware takes routes, several policies per route, costs
// and the other Options. Every invalid option is an error at
// construction, naming the option, its value and the rule it breaks.
//
// The handler behind the middleware finds the Decision in its request's
// context (FromContext) and can give the units back (Refund) when the
// work it was admitted for was not done; Options.Deny writes custom
// answers to the requests the middleware refuses.
//
// The middleware has the func(http.Handler) http.Handler shape that the
// standard library, chi (r.Use) and gorilla/mux (r.Use) all accept.
package httplimit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
	"github.com/sluicehq/sluice/subject"
)

// DefaultDeadline is how long the middleware waits for a decision unless
// Options.Deadline says otherwise: long enough that a burst of 500
// concurrent requests on a busy two-core machine with a healthy local
// Redis gets no 503 (100ms gave about half of them one), short enough that
// a failing store is answered by the failure mode well within a second,
// and the store's circuit breaker soon answers at once.
const DefaultDeadline = 500 * time.Millisecond

// DefaultOperation is the operation of requests that no route matches and
// that Options.Default limits.
const DefaultOperation = "*"

// Source is a place a subject's identity can come from. Its String form is
// the kind folded into the pseudonym.
type Source uint8

// Sources. The default order is FromPrincipal, FromAPIKey, FromIP:
// without Options.Principal and Options.APIKeyHeader, the client address.
const (
	// FromPrincipal: the authenticated principal, from Options.Principal.
	FromPrincipal Source = iota + 1
	// FromAPIKey: the value of the Options.APIKeyHeader header.
	FromAPIKey
	// FromIPUserAgent: the client IP prefix together with a digest of the
	// User-Agent, so clients behind one NAT get separate budgets. Skipped
	// when the request has no User-Agent. Not in the default order, and
	// only for routes where that is acceptable: a client that varies its
	// User-Agent gets a fresh budget every time.
	FromIPUserAgent
	// FromIP: the client IP prefix (see Options.TrustedProxies,
	// IPv4Prefix, IPv6Prefix).
	FromIP
)

var sourceNames = [...]string{FromPrincipal: "principal", FromAPIKey: "api_key", FromIPUserAgent: "ip_user_agent", FromIP: "ip"}

// String returns the kind folded into the pseudonym, e.g. "api_key".
func (s Source) String() string {
	if s >= FromPrincipal && s <= FromIP {
		return sourceNames[s]
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// defaultSources is the resolution order unless Options.Sources says
// otherwise. Nothing the client controls freely (a User-Agent) is in it:
// the principal comes from the application's authentication, the API key
// header is only read when configured, and the address is resolved
// through trusted proxies only.
var defaultSources = []Source{FromPrincipal, FromAPIKey, FromIP}

// AnonymousKind is the kind of the shared subject of ShareAnonymous.
const AnonymousKind = "anonymous"

// Anonymous says what becomes of a request none of the sources identifies
// (no principal and no API key on a route that reads only those, or an
// unusable RemoteAddr).
type Anonymous uint8

const (
	// DenyAnonymous answers 403 Forbidden with a problem body, without
	// asking the Limiter.
	DenyAnonymous Anonymous = iota
	// ShareAnonymous puts every such request of a route into one shared
	// budget (kind "anonymous", identity "").
	ShareAnonymous
	// PassAnonymous lets such requests go on, unlimited, so that the
	// application's own authentication answers them (typically 401 for a
	// missing API key). Use it only where the next handler refuses every
	// unidentified request.
	PassAnonymous
)

// Route selects the policies of the requests it matches.
type Route struct {
	// Operation names the route inside every subject: routes with
	// different operations have separate budgets even under the same
	// policy; routes naming the same operation share them. Required when
	// Match is set. Default: the methods and prefix, e.g. "POST /login" or
	// "* /api".
	Operation string
	// Methods the route matches, e.g. []string{"POST"}. GET includes HEAD,
	// as in http.ServeMux, so HEAD cannot reach a GET handler unlimited.
	// Default: any.
	Methods []string
	// PathPrefix the route matches, by whole path segments: "/api" matches
	// "/api" and "/api/users", not "/apikeys". The request path is cleaned
	// first ("/a/../api//x" is "/api/x"), so a path cannot be spelled to
	// slip past a route. Default: "/", every path.
	PathPrefix string
	// Match, when set, decides instead of Methods and PathPrefix.
	// Default: nil.
	Match func(*http.Request) bool
	// Policies are the IDs of the Limiter's policies the route spends, all
	// or nothing. At least one is required.
	Policies []string
	// Cost is the number of units one request spends, e.g. 5 for an
	// expensive search; at most every policy's MaxCost. Default: 1.
	Cost int64
	// Sources override Options.Sources for this route. Default: nil, use
	// Options.Sources.
	Sources []Source
	// APIKeyHeader overrides Options.APIKeyHeader for this route.
	// Default: "", use Options.APIKeyHeader.
	APIKeyHeader string
	// Shadow makes this route report but never block. Default: false
	// (Options.Shadow applies to every route).
	Shadow bool
}

// Options configure the middleware. The zero value means the defaults.
type Options struct {
	// Routes select policies per request; the first route that matches
	// wins. Default: none, every request gets Default.
	Routes []Route
	// Default are the policy IDs of requests no route matches, under
	// operation DefaultOperation, at a cost of 1. Default: none, such
	// requests pass unlimited and without headers.
	Default []string
	// Sources is the order in which a subject is resolved; the first that
	// yields an identity wins. Default: FromPrincipal, FromAPIKey, FromIP,
	// which is the client address unless Principal or APIKeyHeader is set.
	Sources []Source
	// Pseudonymizer turns (kind, identity, operation) into the subject the
	// Limiter sees. Default: subject.Unkeyed(), whose pseudonyms anyone can
	// recompute from a guessed identity (an IPv4 address is guessed in
	// minutes): configure a keyed one (subject.New) in production.
	Pseudonymizer *subject.Pseudonymizer
	// Principal returns the authenticated principal of a request, e.g. the
	// user ID an authentication middleware put in the context, and whether
	// there is one. Default: nil, FromPrincipal never matches.
	Principal func(*http.Request) (string, bool)
	// APIKeyHeader is the header that carries an API key, e.g. "X-API-Key".
	// Only its pseudonym is used: the key itself is not checked here.
	// Default: "", FromAPIKey never matches.
	APIKeyHeader string
	// TrustedProxies are CIDR prefixes (or addresses) of the proxies whose
	// ForwardedHeader is believed; see subject.IPResolver for the rule.
	// Default: none, the socket peer is the client.
	TrustedProxies []string
	// ForwardedHeader is the one header trusted proxies append the client
	// to: subject.XForwardedFor or subject.Forwarded.
	// Default: subject.XForwardedFor.
	ForwardedHeader string
	// IPv4Prefix is how many bits of an IPv4 client address identify it.
	// Default: 32.
	IPv4Prefix int
	// IPv6Prefix is how many bits of an IPv6 client address identify it,
	// so one host cannot rotate through its addresses. Default: 64.
	IPv6Prefix int
	// Anonymous says what becomes of a request no source identifies.
	// Default: DenyAnonymous.
	Anonymous Anonymous
	// IdempotencyKeyHeader names a request header, typically
	// "Idempotency-Key", whose value identifies a request across its
	// retries: a retry with the same value gets the first decision back
	// (Outcome.Replayed) instead of spending again, within each policy's
	// DedupeTTL. Only a digest of the value reaches the Limiter. Set it
	// only where the application itself answers a repeated key without
	// doing the work again: a client that repeats a key is not charged
	// again. Default: "", every request spends.
	IdempotencyKeyHeader string
	// Deny, when set, writes the answer to every request the middleware
	// refuses instead of the built-in RFC 9457 problem: limited (429),
	// failed closed (503) and unidentified (403, with DenyAnonymous). The
	// Decision is in the request's context (FromContext); its Status is
	// the status the built-in answer would have. RateLimit-Policy,
	// RateLimit and, for 429 and 503, Retry-After are already set; Deny
	// writes the status and the body. Default: nil, the built-in answer.
	Deny http.Handler
	// Deadline bounds how long one request waits for the Limiter; past it
	// the outcome is Unavailable and the failure mode answers. The local
	// fallback, when consulted, gets a deadline of its own.
	// Default: DefaultDeadline (500ms).
	Deadline time.Duration
	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds from now) for clients that predate the
	// draft. Default: false.
	LegacyHeaders bool
	// Shadow makes every route report but never block. Default: false.
	Shadow bool
	// Fallback is the Limiter consulted for policies whose failure mode is
	// FailLocal when the main Limiter cannot decide; see LocalFallback.
	// Required when a route spends such a policy. Default: nil.
	Fallback *sluice.Limiter
	// Logger receives a record per decision: failures at Warn, shadow
	// would-be denials and anonymous denials at Info, the rest at Debug.
	// Records carry the pseudonym, never the identity.
	// Default: slog.Default().
	Logger *slog.Logger
	// OnDecision, when set, is called once per limited request, before the
	// request goes on or the answer is written, e.g. to count decisions in
	// metrics. It must be safe for concurrent use. Default: nil.
	OnDecision func(*http.Request, Decision)
}

// Middleware is the compiled middleware. Create it with NewMiddleware or
// PerIP; the zero value is not usable. Immutable and safe for concurrent
// use; it owns no goroutines (close the Limiters' stores yourself).
type Middleware struct {
	warnings   logthrottle.Throttle // of failed-decision lines
	limiter    *sluice.Limiter
	fallback   *sluice.Limiter
	routes     []*route
	fallthru   *route // Options.Default, or nil
	pseudo     *subject.Pseudonymizer
	ips        *subject.IPResolver
	principal  func(*http.Request) (string, bool)
	anonymous  Anonymous
	idemHeader string
	deny       http.Handler
	deadline   time.Duration
	legacy     bool
	shadow     bool
	log        *slog.Logger
	onDecision func(*http.Request, Decision)
}

type route struct {
	operation    string
	methods      []string // nil: any; upper case
	prefix       string   // as configured, cleaned: part of the operation
	canonical    string   // prefix in the canonical form requests are matched in
	match        func(*http.Request) bool
	policies     []string
	cost         int64
	local        []string // the FailLocal ones
	mode         sluice.FailureMode
	sources      []Source
	apiKeyHeader string
	shadow       bool
	policyField  string // the RateLimit-Policy field value
}

// New returns the middleware for limiter and opts, for options known to be
// valid. Invalid options cannot be returned as an error here: the
// middleware then answers every request 500 and the error is logged once.
// Prefer NewMiddleware (or PerIP), which return the error at construction.
func New(limiter *sluice.Limiter, opts Options) func(http.Handler) http.Handler {
	m, err := NewMiddleware(limiter, opts)
	if err == nil {
		return m.Handler
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log.Error("httplimit: invalid options: every request is answered 500", slog.String("err", err.Error()))
	return func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeProblem(w, http.StatusInternalServerError, problem{
				Type:   "about:blank",
				Title:  "Internal Server Error",
				Status: http.StatusInternalServerError,
				Detail: "The rate limiter is misconfigured.",
			})
		})
	}
}

// NewMiddleware validates opts against limiter and compiles the routes.
func NewMiddleware(limiter *sluice.Limiter, opts Options) (*Middleware, error) {
	if limiter == nil {
		return nil, errors.New("httplimit: limiter is nil")
	}
	m := &Middleware{
		limiter:    limiter,
		fallback:   opts.Fallback,
		pseudo:     opts.Pseudonymizer,
		principal:  opts.Principal,
		anonymous:  opts.Anonymous,
		idemHeader: opts.IdempotencyKeyHeader,
		deny:       opts.Deny,
		deadline:   opts.Deadline,
		legacy:     opts.LegacyHeaders,
		shadow:     opts.Shadow,
		log:        opts.Logger,
		onDecision: opts.OnDecision,
	}
	if m.pseudo == nil {
		m.pseudo = subject.Unkeyed()
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	switch {
	case m.deadline == 0:
		m.deadline = DefaultDeadline
	case m.deadline < 0:
		return nil, optionError("Deadline", opts.Deadline, "must not be negative")
	}
	if m.anonymous > PassAnonymous {
		return nil, optionError("Anonymous", uint8(opts.Anonymous), "must be DenyAnonymous, ShareAnonymous or PassAnonymous")
	}
	if h := opts.IdempotencyKeyHeader; h != "" && !httpguts.ValidHeaderFieldName(h) {
		return nil, optionError("IdempotencyKeyHeader", fmt.Sprintf("%q", h), "must be a header name such as Idempotency-Key")
	}
	if h := opts.APIKeyHeader; h != "" && !httpguts.ValidHeaderFieldName(h) {
		return nil, optionError("APIKeyHeader", fmt.Sprintf("%q", h), "must be a header name such as X-API-Key")
	}
	trusted, err := subject.ParseTrustedProxies(opts.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	m.ips, err = subject.NewIPResolver(subject.IPOptions{
		Trusted:    trusted,
		Header:     opts.ForwardedHeader,
		IPv4Prefix: opts.IPv4Prefix,
		IPv6Prefix: opts.IPv6Prefix,
	})
	if err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	sources := slices.Clone(opts.Sources)
	if len(sources) == 0 {
		sources = defaultSources
	}
	if err := checkSources("Sources", sources); err != nil {
		return nil, err
	}
	seen := map[string]int{}
	for i, rt := range opts.Routes {
		at := fmt.Sprintf("Routes[%d]", i)
		c, err := m.compile(at, rt, sources, opts.APIKeyHeader)
		if err != nil {
			return nil, err
		}
		if j, dup := seen[c.operation]; dup && rt.Operation == "" {
			return nil, optionError(at+".Operation", fmt.Sprintf("%q (the default)", c.operation), fmt.Sprintf("is also Routes[%d]'s: name one Operation explicitly to share budgets", j))
		}
		seen[c.operation] = i
		m.routes = append(m.routes, c)
	}
	if len(opts.Default) > 0 {
		c, err := m.compile("Default", Route{Operation: DefaultOperation, Policies: opts.Default}, sources, opts.APIKeyHeader)
		if err != nil {
			return nil, err
		}
		m.fallthru = c
	}
	return m, nil
}

// optionError is an invalid option: where it is, its value and the rule
// it breaks, e.g.
//
//	httplimit: Routes[0].Policies[0] = "logn": the limiter has no such policy; it has login, api
func optionError(at string, value any, rule string) error {
	return fmt.Errorf("httplimit: %s = %v: %s", at, value, rule)
}

func checkSources(at string, ss []Source) error {
	for i, s := range ss {
		if s < FromPrincipal || s > FromIP {
			return optionError(fmt.Sprintf("%s[%d]", at, i), s, "unknown source: must be FromPrincipal, FromAPIKey, FromIPUserAgent or FromIP")
		}
	}
	return nil
}

// compile checks rt, found at at ("Routes[2]", "Default"), against the
// limiters and returns it ready to match.
func (m *Middleware) compile(at string, rt Route, sources []Source, apiKeyHeader string) (*route, error) {
	c := &route{
		operation:    rt.Operation,
		match:        rt.Match,
		sources:      sources,
		apiKeyHeader: apiKeyHeader,
		shadow:       rt.Shadow,
		mode:         sluice.FailOpen,
		cost:         rt.Cost,
	}
	if len(rt.Sources) > 0 {
		if err := checkSources(at+".Sources", rt.Sources); err != nil {
			return nil, err
		}
		c.sources = slices.Clone(rt.Sources)
	}
	if rt.APIKeyHeader != "" {
		if !httpguts.ValidHeaderFieldName(rt.APIKeyHeader) {
			return nil, optionError(at+".APIKeyHeader", fmt.Sprintf("%q", rt.APIKeyHeader), "must be a header name such as X-API-Key")
		}
		c.apiKeyHeader = rt.APIKeyHeader
	}
	switch {
	case c.cost == 0:
		c.cost = 1
	case c.cost < 0:
		return nil, optionError(at+".Cost", rt.Cost, "must not be negative; leave it 0 for 1")
	}
	if rt.Match == nil {
		c.prefix = rt.PathPrefix
		if c.prefix == "" {
			c.prefix = "/"
		}
		if c.prefix[0] != '/' {
			return nil, optionError(at+".PathPrefix", fmt.Sprintf("%q", rt.PathPrefix), `must start with "/"`)
		}
		if c.prefix != "/" {
			c.prefix = strings.TrimSuffix(path.Clean(c.prefix), "/")
		}
		c.canonical = canonicalPath(c.prefix)
		for j, meth := range rt.Methods {
			if !httpguts.ValidHeaderFieldName(meth) {
				return nil, optionError(fmt.Sprintf("%s.Methods[%d]", at, j), fmt.Sprintf("%q", meth), "must be an HTTP method such as GET or POST")
			}
			c.methods = append(c.methods, strings.ToUpper(meth))
		}
		if slices.Contains(c.methods, http.MethodGet) && !slices.Contains(c.methods, http.MethodHead) {
			c.methods = append(c.methods, http.MethodHead)
		}
		if c.operation == "" {
			ms := "*"
			if len(rt.Methods) > 0 {
				ms = strings.ToUpper(strings.Join(rt.Methods, ","))
			}
			c.operation = ms + " " + c.prefix
		}
	} else if c.operation == "" {
		return nil, optionError(at+".Operation", `""`, "is required with Match")
	}
	if len(rt.Policies) == 0 {
		return nil, optionError(at+".Policies", "[]", "at least one policy ID is required")
	}
	var field []byte
	for j, id := range rt.Policies {
		pat := fmt.Sprintf("%s.Policies[%d]", at, j)
		p, ok := m.limiter.Policy(id)
		if !ok {
			return nil, optionError(pat, fmt.Sprintf("%q", id), "the limiter has no such policy; it has "+strings.Join(m.limiter.Policies(), ", "))
		}
		if slices.Contains(c.policies, id) {
			return nil, optionError(pat, fmt.Sprintf("%q", id), "is named twice")
		}
		if c.cost > p.MaxCost && p.Algorithm != sluice.Concurrency { // a lease is one slot whatever the cost
			return nil, optionError(at+".Cost", c.cost, fmt.Sprintf("must be at most the max cost of policy %q, %d", id, p.MaxCost))
		}
		c.policies = append(c.policies, id)
		switch p.FailureMode {
		case sluice.FailClosed:
			c.mode = sluice.FailClosed
		case sluice.FailLocal:
			if m.fallback == nil {
				return nil, optionError(pat, fmt.Sprintf("%q", id), "fails local, but Options.Fallback is nil (see LocalFallback)")
			}
			lp, ok := m.fallback.Policy(id)
			if !ok {
				return nil, optionError(pat, fmt.Sprintf("%q", id), "fails local, but the fallback limiter has no such policy")
			}
			if c.cost > lp.MaxCost && lp.Algorithm != sluice.Concurrency {
				return nil, optionError(at+".Cost", c.cost, fmt.Sprintf("must be at most the max cost of policy %q in the fallback limiter, %d", id, lp.MaxCost))
			}
			c.local = append(c.local, id)
			if c.mode == sluice.FailOpen {
				c.mode = sluice.FailLocal
			}
		}
		if j > 0 {
			field = append(field, ", "...)
		}
		field = ratelimitheader.AppendPolicyItem(field, p)
	}
	c.policyField = string(field)
	return c, nil
}

// Handler wraps next: requests a route matches are limited, the others go
// straight to next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

func (m *Middleware) routeOf(r *http.Request) *route {
	var p string
	for _, rt := range m.routes {
		if rt.match != nil {
			if rt.match(r) {
				return rt
			}
			continue
		}
		if rt.methods != nil && !slices.Contains(rt.methods, strings.ToUpper(r.Method)) {
			continue
		}
		if rt.prefix == "/" {
			return rt
		}
		if p == "" {
			p = canonicalPath(r.URL.Path)
		}
		if hasPathPrefix(p, rt.canonical) {
			return rt
		}
	}
	return m.fallthru
}

// canonicalPath is the form routes match paths in, so that no spelling a
// lenient upstream server takes for the same path dodges its route: lower
// case; each segment without ;parameters (Tomcat, Jetty) and without
// trailing dots and spaces (IIS); dot segments resolved. Methods match
// whatever their case. "/LOGIN", "/login;jsessionid=1", "/login..;/" and
// "/login." all match "/login".
func canonicalPath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if j := strings.IndexByte(s, ';'); j >= 0 {
			s = s[:j]
		}
		if s != "." && s != ".." {
			s = strings.TrimRight(s, ". ")
		}
		segs[i] = strings.ToLower(s)
	}
	p = strings.Join(segs, "/")
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	return path.Clean(p)
}

// hasPathPrefix reports whether p starts with the whole segments of
// prefix (which has no trailing slash).
func hasPathPrefix(p, prefix string) bool {
	return strings.HasPrefix(p, prefix) && (len(p) == len(prefix) || p[len(prefix)] == '/')
}

// subjectOf resolves the identity of r along rt's sources.
func (m *Middleware) subjectOf(r *http.Request, rt *route) (kind, identity string, ok bool) {
	var (
		ip       netip.Prefix
		resolved bool
	)
	clientIP := func() (netip.Prefix, bool) {
		if !resolved {
			resolved = true
			if p, err := m.ips.Prefix(r); err == nil {
				ip = p
			}
		}
		return ip, ip.IsValid()
	}
	for _, s := range rt.sources {
		switch s {
		case FromPrincipal:
			if m.principal != nil {
				if id, ok := m.principal(r); ok && id != "" {
					return s.String(), id, true
				}
			}
		case FromAPIKey:
			// Sent more than once, the header names no one subject (and an
			// upstream may read either line): it identifies nobody.
			if vals := r.Header.Values(rt.apiKeyHeader); rt.apiKeyHeader != "" && len(vals) == 1 && vals[0] != "" {
				return s.String(), vals[0], true
			}
		case FromIPUserAgent:
			if ua := r.UserAgent(); ua != "" {
				if p, ok := clientIP(); ok {
					sum := sha256.Sum256([]byte(ua))
					return s.String(), p.String() + " " + hex.EncodeToString(sum[:8]), true
				}
			}
		case FromIP:
			if p, ok := clientIP(); ok {
				return s.String(), p.String(), true
			}
		}
	}
	return "", "", false
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	rt := m.routeOf(r)
	if rt == nil {
		next.ServeHTTP(w, r)
		return
	}
	h := w.Header()
	h.Set("RateLimit-Policy", rt.policyField)
	d := Decision{Operation: rt.operation, Policies: rt.policies, Cost: rt.cost}
	kind, identity, ok := m.subjectOf(r, rt)
	if !ok {
		if m.anonymous != ShareAnonymous {
			d.Action = NoSubject
			m.finish(w, r, next, rt, &d, sluice.Outcome{})
			return
		}
		kind, identity = AnonymousKind, ""
	}
	d.SubjectKind = kind
	d.Subject = m.pseudo.Pseudonym(kind, identity, rt.operation)
	d.previous = m.pseudo.Previous(kind, identity, rt.operation)
	if m.idemHeader != "" {
		if key := r.Header.Get(m.idemHeader); key != "" {
			d.EvaluationID = evaluationID(key)
		}
	}

	ctx, cancel := context.WithTimeout(r.Context(), m.deadline)
	d.Outcome = m.limiter.Check(ctx, request(m.limiter, rt.policies, &d))
	cancel()
	decided := d.Outcome
	switch d.Outcome.Kind {
	case sluice.Allowed:
		d.Action = Admitted
	case sluice.Denied:
		d.Action = Limited
	default:
		switch rt.mode {
		case sluice.FailOpen:
			d.Action = FailedOpen
		case sluice.FailLocal:
			d.Local = true
			ctx, cancel := context.WithTimeout(r.Context(), m.deadline)
			d.LocalOutcome = m.fallback.Check(ctx, request(m.fallback, rt.local, &d))
			cancel()
			decided = d.LocalOutcome
			switch d.LocalOutcome.Kind {
			case sluice.Allowed:
				d.Action = Admitted
			case sluice.Denied:
				d.Action = Limited
			default:
				d.Action = FailedClosed
			}
		default:
			d.Action = FailedClosed
		}
	}
	m.finish(w, r, next, rt, &d, decided)
}

// request is the Limiter request that spends d's cost of policies, and
// acquires a lease on those of them that are concurrency policies of lim.
func request(lim *sluice.Limiter, policies []string, d *Decision) sluice.Request {
	req := sluice.Request{Subject: d.Subject, Previous: d.previous, Cost: d.Cost, EvaluationID: d.EvaluationID}
	for _, id := range policies {
		if p, _ := lim.Policy(id); p.Algorithm == sluice.Concurrency {
			req.Op = sluice.Acquire
			break
		}
	}
	if len(policies) == 1 {
		req.Policy = policies[0]
	} else {
		req.Policies = policies
	}
	return req
}

// evaluationID turns an idempotency key as the client sent it into an
// evaluation ID: a digest, so any value is a valid ID and the key itself
// never reaches the store.
func evaluationID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "ik:" + base64.RawURLEncoding.EncodeToString(sum[:18])
}

// finish adds the headers of the deciding outcome, records d, and either
// answers or passes r on.
func (m *Middleware) finish(w http.ResponseWriter, r *http.Request, next http.Handler, rt *route, d *Decision, decided sluice.Outcome) {
	h := w.Header()
	if decided.Kind == sluice.Allowed || decided.Kind == sluice.Denied {
		m.setStatusHeaders(h, decided)
	}
	switch d.Action {
	case Limited:
		d.Status = http.StatusTooManyRequests
	case FailedClosed:
		d.Status = http.StatusServiceUnavailable
	case NoSubject:
		if m.anonymous == DenyAnonymous {
			d.Status = http.StatusForbidden
		}
	}
	if d.Status != 0 && (m.shadow || rt.shadow) {
		d.Shadow, d.Status = true, 0
	}
	m.record(r, d)
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, &state{d: *d, m: m, rt: rt}))
	var retry int64
	switch d.Status {
	case 0:
		if d.Action == Admitted && decided.Lease.ID != "" {
			// Released when next returns, panics, or gives up on a client
			// that went away (r's context is canceled then; a handler that
			// ignores it holds the slot until it returns or the lease
			// expires).
			lim := m.limiter
			if d.Local {
				lim = m.fallback
			}
			defer m.release(r.Context(), lim, decided.Lease)
		}
		next.ServeHTTP(w, r)
		return
	case http.StatusTooManyRequests:
		retry = ratelimitheader.RetryAfterSeconds(decided.RetryAfter)
		h.Set("Retry-After", strconv.FormatInt(retry, 10))
	case http.StatusServiceUnavailable:
		h.Set("Retry-After", "1")
	}
	if m.deny != nil {
		m.deny.ServeHTTP(w, r)
		return
	}
	switch d.Status {
	case http.StatusTooManyRequests:
		writeProblem(w, d.Status, problem{
			Type:             QuotaExceededType,
			Title:            "Request cannot be satisfied as assigned quota has been exceeded",
			Status:           d.Status,
			Detail:           fmt.Sprintf("Too many requests; retry in %d s.", retry),
			ViolatedPolicies: violated(decided),
		})
	case http.StatusServiceUnavailable:
		writeProblem(w, d.Status, problem{
			Type:   "about:blank",
			Title:  "Service Unavailable",
			Status: d.Status,
			Detail: "The rate limiter could not decide; retry shortly.",
		})
	case http.StatusForbidden:
		writeProblem(w, d.Status, problem{
			Type:   "about:blank",
			Title:  "Forbidden",
			Status: d.Status,
			Detail: "The request carries no identity this endpoint can be rate limited by.",
		})
	}
}

// release gives lease back to lim, with a deadline of its own: r's
// context may be canceled already (the client went away).
func (m *Middleware) release(ctx context.Context, lim *sluice.Limiter, lease sluice.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.deadline)
	defer cancel()
	o := lim.Release(ctx, lease)
	if o.Kind == sluice.Allowed {
		return
	}
	if ok, suppressed := m.warnings.Allow(sluice.SystemClock{}.Now()); ok {
		m.log.Warn("sluice: lease not released; it is held until its lease_ttl passes",
			"policies", lease.Policies, "subject", lease.Subject, "outcome", o.Kind.String(), "error", o.Reason(), "suppressed", suppressed)
	}
}

// violated lists the policies that denied o.
func violated(o sluice.Outcome) []string {
	if len(o.Statuses) == 0 {
		return []string{o.Policy}
	}
	var ids []string
	for _, s := range o.Statuses {
		if !s.Allowed {
			ids = append(ids, s.Policy)
		}
	}
	return ids
}
