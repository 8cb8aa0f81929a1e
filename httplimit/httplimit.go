// Package httplimit is sluice's net/http middleware. For each request it
// picks the route's policies, resolves who is asking (by default the
// client address; the address behind trusted proxies, a principal or an
// API key where configured), turns that into a pseudonym, asks the
// Limiter within a deadline, and answers:
//
//   - allowed: the request goes on, with RateLimit-Policy and RateLimit
//     header fields (draft-ietf-httpapi-ratelimit-headers);
//   - denied: 429 Too Many Requests, Retry-After, and an RFC 9457 problem
//     of the draft's quota-exceeded type listing the violated policies;
//   - undecidable (store down, deadline passed, reply lost, corrupt
//     state): per the route's failure mode, 503 with Retry-After (closed),
//     the request goes on (open), or a local limiter holding a share of
//     each limit decides (local).
//
// The raw identity (a principal, an API key, an IP address) is only ever
// hashed: it never reaches the Limiter, a log line or a Decision.
//
// PerIP builds the common case in one call: one policy, per client
// address. New takes routes, several policies per route, costs and the
// other Options. Every invalid option is an error at construction,
// naming the option, its value and the rule it breaks.
//
// Who a request is limited as is one function of the request, a
// subject.KeyFunc: Options.Subject, or a Route's own. subject.ClientIP
// (the address behind trusted proxies), subject.Header and
// subject.Principal build the usual ones; subject.FirstOf chains them.
// grpclimit takes the same functions.
//
// The handler behind the middleware finds the Decision in its request's
// context (FromContext) and can give the units back (Refund) when the
// work it was admitted for was not done; Options.Deny writes custom
// answers to the requests the middleware refuses.
//
// In front of a reverse proxy, Options.StrictPaths refuses the paths
// servers read differently and passes the others on in the normal form
// the routes matched, so the upstream cannot read a spelling as a
// limited route that the middleware did not.
//
// Middleware.Handler has the func(http.Handler) http.Handler shape that
// the standard library, chi (r.Use) and gorilla/mux (r.Use) all accept.
package httplimit

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/subject"
)

// defaultOperation is the operation of requests that no route matches and
// that Options.Default limits.
const defaultOperation = "*"

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
	// "/api" and "/api/users", not "/apikeys". Paths are compared in a
	// canonical form, so that no spelling a lenient server takes for the
	// same path slips past a route: "/a/../API//x", "/api;x=1/x",
	// `/api\x` and "/api./x" are all "/api/x" (see Options.StrictPaths
	// for refusing such spellings instead). Default: "/", every path.
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
	// Subject says who the route's requests are limited as.
	// Default: nil, Options.Subject.
	Subject subject.KeyFunc
	// Shadow makes this route report but never block. Default: false
	// (Options.Shadow applies to every route).
	Shadow bool
	// FailureMode answers the route's requests when the Limiter cannot
	// decide: failure.Closed (503 with Retry-After), failure.Open
	// (the request goes on, logged) or failure.Local (the local
	// fallback decides, see Options.Fallback). Default: FailClosed.
	FailureMode failure.Mode
	// SettleHeader, when set, is the response header (or trailer) in
	// which the handler reports what the request really cost, e.g.
	// "X-Tokens-Used" for an LLM call: the route then spends Cost as a
	// sluice.Estimate and, once the handler is done, settles it with that
	// value, giving back the difference or charging the excess past the
	// limit. A header's value is taken as the header is written, so a
	// client that hangs up afterwards pays it all the same (though the
	// handler then gives up, or panics as httputil.ReverseProxy does); a
	// trailer's once the handler returns. A missing or malformed value
	// (not a decimal integer of 0 or more), or a panic before the header
	// is written, settles at the estimate: nothing given back; a value
	// above 1e9, the most a settle takes, settles as 1e9. The route's
	// policies must take estimates (fixed_window, sliding_log,
	// token_bucket, gcra); their DedupeTTL is how long an estimate waits
	// for its settle. Default: "", a plain spend.
	SettleHeader string
	// Priority is the priority class the route's requests are decided as
	// (sluice.Request.Priority), e.g. "sheddable" for batch traffic: one a
	// policy of the route declares (Policy.Priorities), checked by New.
	// Default: "", the class "default".
	Priority string
	// PriorityFunc, when set, picks a request's class instead, e.g. from
	// a header that only a trusted gateway sets (never from one any client
	// may set: a client would name itself critical). "" falls back to
	// Priority; a class the route's policies do not declare is answered as
	// the Limiter answers an Incompatible request (500). Default: nil.
	PriorityFunc func(*http.Request) string
	// MaxDelay, when set, holds a request that would be denied for up to
	// this long instead: it books the next slot of the route's one policy
	// (gcra or token_bucket: sluice.Book) in the same store decision and
	// goes on at that slot, with no store call while it waits; it is
	// refused (429) only when its slot lies further ahead, or when
	// QueueLimit requests are already held (then it is decided as a
	// plain spend). A client that goes away while held gives its slot
	// back and is answered nothing. A whole number of ms, 1ms to the
	// policy's MaxWait (which bounds every booking); not with Shadow or SettleHeader, and an idempotency key is not
	// sent (a booking takes no evaluation id). Default: 0, refused at
	// once, NGINX's limit_req without delay.
	MaxDelay time.Duration
	// QueueLimit is the most requests the route holds at once for their
	// slots (MaxDelay). Default: 1000.
	QueueLimit int
}

// Options configure the middleware. The zero value means the defaults.
type Options struct {
	// Routes select policies per request; the first route that matches
	// wins. Default: none, every request gets Default.
	Routes []Route
	// Default are the policy IDs of requests no route matches, under
	// operation "*", at a cost of 1. Default: none, such requests pass
	// unlimited and without headers.
	Default []string
	// FailureMode is Default's failure mode (see Route.FailureMode).
	// Default: failure.Closed.
	FailureMode failure.Mode
	// Subject says who a request is limited as, for the routes that do
	// not say it themselves, e.g. subject.FirstOf(subject.Principal(userID),
	// subject.ClientIP(ips)). Default: subject.ClientIP(nil), the socket
	// peer's address.
	Subject subject.KeyFunc
	// PassAnonymous lets requests that Subject does not identify go on,
	// unlimited, so that the application's own authentication answers
	// them (typically 401 for a missing API key). Use it only where the
	// next handler refuses every unidentified request. Default: false,
	// they are answered 403 Forbidden with a problem body, without asking
	// the Limiter.
	PassAnonymous bool
	// Pseudonymizer turns (kind, identity, operation) into the subject the
	// Limiter sees. Default: subject.Unkeyed(), whose pseudonyms anyone can
	// recompute from a guessed identity (an IPv4 address is guessed in
	// minutes): configure a keyed one (subject.New) in production.
	Pseudonymizer *subject.Pseudonymizer
	// IdempotencyKeyHeader names a request header, typically
	// "Idempotency-Key", whose value identifies a request across its
	// retries: a retry with the same value gets the first decision back
	// (Outcome.Replayed) instead of spending again, within each policy's
	// DedupeTTL. Only a digest of the value reaches the Limiter. Set it
	// only where the application itself answers a repeated key without
	// doing the work again: a client that repeats a key is not charged
	// again. Default: "", every request spends.
	IdempotencyKeyHeader string
	// StrictPaths answers 400 Bad Request, with a problem body, to a
	// request whose path servers read differently: a backslash, a NUL or
	// other control byte, an encoded slash or backslash (%2F, %5C), a #
	// (raw or %23: some servers end the path there), a malformed %-escape, or a dot segment in disguise ("..;", "..."). The
	// other paths go on normalised, so that the next handler reads the
	// path the routes matched: encoded unreserved characters ("%2E",
	// "%61") decoded, empty segments ("//") and dot segments removed. Set
	// it in front of a reverse proxy, whose upstream may read any such
	// spelling as a limited route. Default: false, paths go on as sent.
	StrictPaths bool
	// Deny, when set, writes the answer to every request the middleware
	// refuses instead of the built-in RFC 9457 problem: limited (429),
	// failed closed (503) and unidentified (403). The Decision is in the
	// request's context (FromContext); its Status is the status the
	// built-in answer would have. RateLimit-Policy, RateLimit and, for 429
	// and 503, Retry-After are already set; Deny writes the status and the
	// body. Default: nil, the built-in answer, whose 429 is of the
	// draft's problem type
	// "https://iana.org/assignments/http-problem-types#quota-exceeded".
	Deny http.Handler
	// Deadline bounds how long one request waits for the Limiter; past it
	// the outcome is Unavailable and the failure mode answers. The local
	// fallback, when consulted, gets a deadline of its own.
	// Default: 500ms: long enough that a burst of 500 concurrent requests
	// on a busy two-core machine with a healthy local Redis gets no 503,
	// short enough that a failing store is answered by the failure mode
	// well within a second.
	Deadline time.Duration
	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds from now) for clients that predate the
	// draft. Default: false.
	LegacyHeaders bool
	// Shadow makes every route report but never block. Default: false.
	Shadow bool
	// Fallback is the store of the local fallback, typically a
	// memstore.Store of this process that the caller owns and closes:
	// when the Limiter cannot decide, the requests of a route whose
	// FailureMode is FailLocal are decided on it, under the same policy
	// IDs, each policy holding LocalShare of its limit. Required when a
	// route fails local. Default: nil.
	Fallback sluice.Store
	// LocalShare is the share of each policy's limit the local
	// fallback holds, in (0, 1]: Limit (and Burst, for token_bucket and
	// gcra) scaled and rounded down, at least 1; MaxCost capped at the new
	// capacity. With n instances of an application, 1/n makes an outage
	// of the shared store degrade to about the configured limit instead
	// of to no limit. Default: 1.
	LocalShare float64
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

// Middleware is the compiled middleware. Create it with New or PerIP; the
// zero value is not usable. Immutable and safe for concurrent use; it
// owns no goroutines (close the Limiter's and the fallback's stores
// yourself).
type Middleware struct {
	core          *edge.Core
	routes        []*route
	fallthru      *route // Options.Default, or nil
	pseudo        *subject.Pseudonymizer
	passAnonymous bool
	strictPaths   bool
	idemHeader    string
	deny          http.Handler
	legacy        bool
	shadow        bool
	log           *slog.Logger
	onDecision    func(*http.Request, Decision)
}

type route struct {
	*edge.Rule
	operation string
	methods   []string // nil: any; upper case
	prefix    string   // as configured, cleaned: part of the operation
	canonical string   // prefix in the canonical form requests are matched in
	match     func(*http.Request) bool
	subject   subject.KeyFunc
	shadow    bool
	settle    string // Route.SettleHeader, canonical
	priority  string // Route.Priority
	classOf   func(*http.Request) string
}

// class returns the priority class of r, a request of rt.
func (rt *route) class(r *http.Request) string {
	if rt.classOf != nil {
		if c := rt.classOf(r); c != "" {
			return c
		}
	}
	return rt.priority
}

// New validates opts against limiter and returns the middleware. The
// error names the option, its value and the rule it breaks, e.g.
//
//	httplimit: Routes[0].Policies[0] = "logn": the limiter has no such policy; it has login, api
func New(limiter *sluice.Limiter, opts Options) (*Middleware, error) {
	if limiter == nil {
		return nil, errors.New("httplimit: limiter is nil")
	}
	m := &Middleware{
		pseudo:        cmp.Or(opts.Pseudonymizer, subject.Unkeyed()),
		passAnonymous: opts.PassAnonymous,
		strictPaths:   opts.StrictPaths,
		idemHeader:    opts.IdempotencyKeyHeader,
		deny:          opts.Deny,
		legacy:        opts.LegacyHeaders,
		shadow:        opts.Shadow,
		log:           cmp.Or(opts.Logger, slog.Default()),
		onDecision:    opts.OnDecision,
	}
	if h := opts.IdempotencyKeyHeader; h != "" && !httpguts.ValidHeaderFieldName(h) {
		return nil, optionError("IdempotencyKeyHeader", fmt.Sprintf("%q", h), "must be a header name such as Idempotency-Key")
	}
	var err error
	m.core, err = edge.New(limiter, edge.Options{
		Fallback: opts.Fallback, LocalShare: opts.LocalShare, Deadline: opts.Deadline, Logger: m.log, Prefix: "httplimit",
	})
	if err != nil {
		return nil, err
	}
	subj := opts.Subject
	if subj == nil {
		subj = subject.ClientIP(nil)
	}
	seen := map[string]int{}
	for i, rt := range opts.Routes {
		at := fmt.Sprintf("Routes[%d]", i)
		c, err := m.compile(at, rt, subj)
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
		c, err := m.compile("Default", Route{Operation: defaultOperation, Policies: opts.Default, FailureMode: opts.FailureMode}, subj)
		if err != nil {
			return nil, err
		}
		m.fallthru = c
	}
	return m, nil
}

// optionError is an invalid option: where it is, its value and the rule
// it breaks.
func optionError(at string, value any, rule string) error {
	return fmt.Errorf("httplimit: %s = %v: %s", at, value, rule)
}

// compile checks rt, found at at ("Routes[2]", "Default"), against the
// limiters and returns it ready to match; subj is Options.Subject.
func (m *Middleware) compile(at string, rt Route, subj subject.KeyFunc) (*route, error) {
	c := &route{operation: rt.Operation, match: rt.Match, subject: rt.Subject, shadow: rt.Shadow}
	if c.subject == nil {
		c.subject = subj
	}
	if rt.Cost < 0 {
		return nil, optionError(at+".Cost", rt.Cost, "must not be negative; leave it 0 for 1")
	}
	if err := c.compileMatch(at, rt); err != nil {
		return nil, err
	}
	r, err := m.core.Rule(at, rt.Policies, rt.Cost, rt.FailureMode)
	if err != nil {
		return nil, err
	}
	if rt.SettleHeader != "" {
		if !httpguts.ValidHeaderFieldName(rt.SettleHeader) {
			return nil, optionError(at+".SettleHeader", fmt.Sprintf("%q", rt.SettleHeader), "must be a header field name such as X-Tokens-Used")
		}
		if err := m.core.Estimates(at, r); err != nil {
			return nil, err
		}
		c.settle = http.CanonicalHeaderKey(rt.SettleHeader)
	}
	if err := m.core.Class(at+".Priority", r, rt.Priority); err != nil {
		return nil, err
	}
	c.priority, c.classOf = rt.Priority, rt.PriorityFunc
	if rt.MaxDelay != 0 || rt.QueueLimit != 0 {
		if rt.Shadow || rt.SettleHeader != "" {
			return nil, optionError(at+".MaxDelay", rt.MaxDelay, "a held request books a plain slot: not with Shadow or SettleHeader")
		}
		if err := m.core.Queue(at, r, rt.MaxDelay, rt.QueueLimit); err != nil {
			return nil, err
		}
	}
	c.Rule = r
	return c, nil
}

// compileMatch sets c's methods, prefix and default operation from rt.
func (c *route) compileMatch(at string, rt Route) error {
	if rt.Match != nil {
		if c.operation == "" {
			return optionError(at+".Operation", `""`, "is required with Match")
		}
		return nil
	}
	c.prefix = cmp.Or(rt.PathPrefix, "/")
	if c.prefix[0] != '/' {
		return optionError(at+".PathPrefix", fmt.Sprintf("%q", rt.PathPrefix), `must start with "/"`)
	}
	if c.prefix != "/" {
		c.prefix = strings.TrimSuffix(path.Clean(c.prefix), "/")
	}
	c.canonical = canonicalPath(c.prefix)
	for j, meth := range rt.Methods {
		if !httpguts.ValidHeaderFieldName(meth) {
			return optionError(fmt.Sprintf("%s.Methods[%d]", at, j), fmt.Sprintf("%q", meth), "must be an HTTP method such as GET or POST")
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
	return nil
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

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.strictPaths {
		var ok bool
		if r, ok = m.strictPath(w, r); !ok {
			return
		}
	}
	rt := m.routeOf(r)
	if rt == nil {
		next.ServeHTTP(w, r)
		return
	}
	d := Decision{Operation: rt.operation, Policies: rt.Policies, Cost: rt.Cost}
	kind, identity := rt.subject(r)
	if identity == "" {
		w.Header().Set("RateLimit-Policy", rt.Field)
		d.Action = actionNoSubject
		m.finish(w, r, next, rt, &d, nil)
		return
	}
	d.SubjectKind = kind
	d.Subject = m.pseudo.Pseudonym(kind, identity, rt.operation)
	d.previous = m.pseudo.Previous(kind, identity, rt.operation)
	if m.idemHeader != "" {
		if key := r.Header.Get(m.idemHeader); key != "" {
			d.EvaluationID = evaluationID(key)
		}
	}
	if rt.settle != "" {
		d.EvaluationID = edge.SettleID(d.subject())
	}
	d.Priority = rt.class(r)
	a := m.core.Decide(r.Context(), rt.Rule, d.subject())
	d.Action, d.Outcome, d.Local, d.LocalOutcome = string(a.Kind), a.Outcome, a.Local, a.LocalOutcome
	d.Waited, d.Queue = a.Delay, a.Queue
	h := w.Header()
	h.Set("RateLimit-Policy", rt.Field)
	if l := a.LimitField(); l != "" {
		h.Set("RateLimit", l)
		if m.legacy {
			edge.SetLegacyHeaders(h, &a)
		}
	}
	m.finish(w, r, next, rt, &d, &a)
}

// subject is who d was limited as, for the core.
func (d *Decision) subject() edge.Subject {
	return edge.Subject{ID: d.Subject, Previous: d.previous, EvaluationID: d.EvaluationID, Priority: d.Priority}
}

// evaluationID turns an idempotency key as the client sent it into an
// evaluation ID: a digest, so any value is a valid ID and the key itself
// never reaches the store.
func evaluationID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "ik:" + base64.RawURLEncoding.EncodeToString(sum[:18])
}

// finish records d and either answers or passes r on; a is the core's
// action, nil for a request without a subject.
func (m *Middleware) finish(w http.ResponseWriter, r *http.Request, next http.Handler, rt *route, d *Decision, a *edge.Action) {
	if a != nil {
		d.Status = a.Status
	} else if !m.passAnonymous {
		d.Status = http.StatusForbidden
	}
	if d.Status != 0 && (m.shadow || rt.shadow) {
		d.Shadow, d.Status = true, 0
	}
	if d.Status != 0 && a != nil {
		w.Header().Set("Retry-After", strconv.FormatInt(a.RetryAfter, 10))
	}
	m.record(r, d)
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, &state{d: *d, m: m, rt: rt}))
	switch {
	case d.Status == 0:
		if a != nil && a.Lease.ID != "" {
			// A lease is released when next returns, panics, or gives up
			// on a client that went away (r's context is canceled then; a
			// handler that ignores it holds the slot until it returns or
			// the lease expires).
			defer m.core.Release(r.Context(), a)
		}
		if a != nil && a.Kind == edge.Admit && rt.settle != "" {
			m.serveSettled(w, r, next, rt, d, a)
			return
		}
		next.ServeHTTP(w, r)
	case a != nil && a.Kind == edge.Abandoned:
		// Its client went away while it was held: nothing to answer.
	case m.deny != nil:
		m.deny.ServeHTTP(w, r)
	case a == nil:
		edge.WriteProblem(w, edge.Problem{
			Type:   "about:blank",
			Title:  "Forbidden",
			Status: http.StatusForbidden,
			Detail: "The request carries no identity this endpoint can be rate limited by.",
		})
	default:
		edge.WriteProblem(w, m.core.Problem(a))
	}
}
