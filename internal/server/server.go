// Package server is the HTTP face of sluice serve: the check API
// (POST /v1/check, and POST /v1/checks for up to 64 at once: see
// checks.go), liveness (GET /healthz), readiness (GET /readyz:
// ready while the store is, or while a policy can be answered without
// it), the store's health (GET /readyz/store), the API's OpenAPI 3.1
// document (GET /openapi.yaml, see openapi.go), Prometheus metrics (GET /metrics, see Metrics), the dashboard (GET /ui,
// see ui.go), and the rate-limiting reverse proxy (see Proxy), which
// listens on an address of its own.
//
// Run serves a whole configuration as sluice serve does: it builds the
// stores, the listeners (TLS, the proxy's, the Envoy rate-limit service's)
// and one generation of these handlers per configuration, which a reload
// replaces (see Run).
//
// The check API's JSON, request and answer, is declared in
// internal/checkapi, which the Go client and sluice check share. It
// answers one JSON object per request:
//
//	{"outcome":"denied","allowed":false,"limit":3,"remaining":0,
//	 "reset_after_ms":7500,"retry_after_ms":7500,"approximate":false,
//	 "reason":"","replayed":false}
//
// An unavailable answer adds "cause", why the store could not decide:
// deadline_passed, failed_before_send, clock_unsafe, circuit_open or
// corrupt_state.
//
// with status 200 (allowed), 429 (denied), 503 (unavailable or
// indeterminate), 400 (malformed request), 404 (unknown policy) or 422
// (any other incompatible request). Allowed and denied answers carry the
// RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers;
// 429 and 503 carry Retry-After. Subjects are pseudonymized before they
// reach the Limiter, a log line or anything else.
//
// With Options.Tokens, POST /v1/check requires "Authorization: Bearer
// <token>": 401 without a valid one, 403 when the token lacks the scope
// (check to spend or peek, refund to give back, reset to clear), and
// the dashboard under /ui requires the admin scope. The health checks and
// /metrics stay open.
//
// "replayed" is always present: true when the answer is the remembered
// first decision of the request's evaluation_id and nothing was spent this
// time. A request with "refund": true gives cost units back instead of
// spending them (422 for a policy whose algorithm cannot refund, such as
// sliding_window). A request with "reset": true (no cost, no
// evaluation_id) clears the subject's state of the named policies, corrupt
// state included: the answer is 200 with the statuses of fresh state.
//
// A check that names concurrency policies acquires a lease when allowed:
// the answer adds "lease_id". POST /v1/release with
// {"policy","subject","lease_id"} (or "policies": those of the check that
// acquired it; rate policies among them are left alone) gives it back:
// 200 whether or not
// the lease was still held (released twice, expired), with the policy's
// status after it. POST /v1/renew with the same body extends it by a
// lease_ttl (acquiring it afresh if it expired: 429 when no slot is
// free). Both need the check scope: the lease id, 128 random bits, is
// what entitles its holder to give it back.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/envoy/rlqs"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
	"github.com/sluicehq/sluice/subject"
)

// DefaultMaxBodyBytes is the default cap on a check request's body.
const DefaultMaxBodyBytes = 64 << 10

// Check is a readiness check: nil when the dependency it probes can serve.
type Check func(ctx context.Context) error

// Options configure a Server. The zero value means the defaults.
type Options struct {
	// Ready are the store's health checks, in order, which GET
	// /readyz/store runs: the first error answers 503. GET /readyz runs
	// them too, but answers 200 despite a failure while a policy can
	// still be answered without the store (see readyz). Stores add their
	// own (a Redis PING). Default: none, so the server is ready as soon
	// as it serves.
	Ready []Check
	// ReadyTimeout bounds all Ready checks of one request together.
	// Default: 2s.
	ReadyTimeout time.Duration
	// DecisionTimeout bounds how long POST /v1/check waits for the
	// store's decision; past it the answer is 503, typed as the Limiter
	// types it (nothing spent, or indeterminate). Default:
	// config.DefaultDecisionTimeout (500ms, the middleware's own default).
	DecisionTimeout time.Duration
	// MaxBodyBytes caps the body of POST /v1/check; a larger body is a 400.
	// Default: DefaultMaxBodyBytes (64 KiB).
	MaxBodyBytes int64
	// Clock times requests for the request log. Default: clock.System{}.
	Clock sluice.Clock
	// Metrics, when set, counts requests and decisions and is served at
	// GET /metrics. Default: nil, no metrics and no /metrics.
	Metrics *Metrics
	// Tokens, when any, are the bearer tokens POST /v1/check accepts.
	// Default: none, the check API and the dashboard are open to anyone
	// who can reach them.
	Tokens []Token
	// ConfigStatus, when set, answers GET /v1/config (see ConfigStatus).
	// Default: nil, no /v1/config.
	ConfigStatus func() ConfigStatus
	// Store describes the store to the dashboard (GET /ui). Default: an
	// unnamed store without a circuit breaker.
	Store StoreInfo
	// ConfigOverrides are the config file's overrides as the Limiter was
	// given them (subjects pseudonymized), so lists tell them from the
	// ones set through the admin API. Default: none.
	ConfigOverrides []sluice.Override
	// Envoy is the Limiter of the rules files' policies (envoy: rules),
	// which the dashboard lists beside the check API's own and the metrics
	// count by their IDs. Default: nil, none (or the same as the check
	// API's, for a config with an envoy section only).
	Envoy *sluice.Limiter
	// EnvoyState is the Envoy service's State, through which the admin
	// API names a subject as the service sees it (an override's envoy
	// descriptor). Default: nil, such overrides are refused.
	EnvoyState *rls.State
	// RLQS is Envoy's quota service's config, through which the admin
	// API names a bucket (an override's rlqs). Default: nil, such
	// overrides are refused (404).
	RLQS *rlqs.Config
	// RLQSBuckets lists at most limit buckets of the quota service (GET
	// /v1/rlqs, the dashboard). Default: nil, GET /v1/rlqs answers 404.
	RLQSBuckets func(limit int) []rlqs.BucketView
	// FailureModes are the policies' failure modes (the config's
	// failure_mode and the rules files'), by ID, for the dashboard.
	// Default: none, every policy fails closed.
	FailureModes map[string]failure.Mode
	// Core is the edge core deciding with the Limiter, counting and
	// bounding every check (internal/wiring builds serve's). Default: one
	// with DecisionTimeout, Metrics, Clock and the logger.
	Core *edge.Core
}

// Server serves the check API over a Limiter. It is an http.Handler, safe
// for concurrent use; it owns no goroutines and needs no cleanup.
type Server struct {
	lim        *sluice.Limiter
	core       *edge.Core      // decides with lim, counts on metrics
	envoy      *sluice.Limiter // the rules files', when not lim
	envoyState *rls.State      // names Envoy subjects for overrides; nil without rules
	// proxySubject names a proxy client for overrides (Proxy.OverrideSubject);
	// nil without a proxy. Set once, before the server serves.
	proxySubject func(route int, ip, header string) ([]string, string, []string, error)
	rlqs         *rlqs.Config                      // names quota service buckets for overrides; nil without envoy.rlqs
	rlqsBuckets  func(limit int) []rlqs.BucketView // nil without envoy.rlqs
	modes        map[string]failure.Mode
	pseud        *subject.Pseudonymizer
	log          *slog.Logger
	ready        []Check
	// storeless names the policies answered without the store when it
	// cannot decide (failure_mode open or local, local quota): while
	// any is, GET /readyz stays 200.
	storeless []string
	readyTTL  time.Duration
	decide    time.Duration // DecisionTimeout
	maxBody   int64
	clock     sluice.Clock
	metrics   *Metrics
	auth      *auth // nil: open
	mux       *http.ServeMux
	// policyField holds each policy's RateLimit-Policy list member, e.g.
	// `"demo";q=3;w=10`, computed once.
	policyField map[string]string
	// configStatus answers GET /v1/config; nil without it.
	configStatus func() ConfigStatus
	store        StoreInfo
	sims         chan struct{} // playground runs in progress
	cfgOverrides []sluice.Override
	// clientErrs throttles the request log's 4xx lines (a client's
	// mistake, repeated at its request rate, or a scanner's) as the edge
	// core throttles its 503s: ten a second, the first after a pause
	// counting those held back.
	clientErrs logthrottle.Throttle
}

// New returns a Server answering checks with lim, pseudonymizing subjects
// with pseud and logging requests to log. A nil lim is a configuration with
// no policies of its own (Envoy rules only, none of them needing the
// store): every check then names an unknown policy.
func New(lim *sluice.Limiter, pseud *subject.Pseudonymizer, log *slog.Logger, opts Options) (*Server, error) {
	switch {
	case pseud == nil:
		return nil, errors.New("server: New: pseudonymizer is nil")
	case log == nil:
		return nil, errors.New("server: New: logger is nil")
	case opts.MaxBodyBytes < 0:
		return nil, fmt.Errorf("server: New: MaxBodyBytes = %d: must not be negative", opts.MaxBodyBytes)
	case opts.ReadyTimeout < 0:
		return nil, fmt.Errorf("server: New: ReadyTimeout = %v: must not be negative", opts.ReadyTimeout)
	case opts.DecisionTimeout < 0:
		return nil, fmt.Errorf("server: New: DecisionTimeout = %v: must not be negative", opts.DecisionTimeout)
	}
	if opts.DecisionTimeout == 0 {
		opts.DecisionTimeout = config.DefaultDecisionTimeout
	}
	for i, c := range opts.Ready {
		if c == nil {
			return nil, fmt.Errorf("server: New: Ready[%d] is nil", i)
		}
	}
	s := &Server{
		lim: lim, pseud: pseud, log: log,
		ready: append([]Check(nil), opts.Ready...), readyTTL: opts.ReadyTimeout, decide: opts.DecisionTimeout,
		maxBody: opts.MaxBodyBytes, clock: opts.Clock, metrics: opts.Metrics,
		mux: http.NewServeMux(), policyField: map[string]string{},
		store: opts.Store, sims: make(chan struct{}, playgroundConcurrent),
		cfgOverrides: opts.ConfigOverrides, configStatus: opts.ConfigStatus,
	}
	s.modes = opts.FailureModes
	s.storeless = s.answeredWithoutStore()
	if opts.Envoy != lim {
		s.envoy = opts.Envoy
	}
	s.envoyState = opts.EnvoyState
	s.rlqs, s.rlqsBuckets = opts.RLQS, opts.RLQSBuckets
	var err error
	if s.auth, err = newAuth(opts.Tokens); err != nil {
		return nil, err
	}
	if s.core, err = s.newCore(opts.Core); err != nil {
		return nil, err
	}
	if s.readyTTL == 0 {
		s.readyTTL = 2 * time.Second
	}
	if s.maxBody == 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.clock == nil {
		s.clock = clock.System{}
	}
	for _, id := range s.policies() {
		p, _ := s.policy(id)
		s.policyField[id] = string(ratelimitheader.AppendPolicyItem(nil, p))
	}
	s.routes()
	return s, nil
}

// routes registers every handler of s on its mux.
func (s *Server) routes() {
	s.mux.HandleFunc(checkPattern, s.check)
	s.mux.HandleFunc("POST "+checkapi.ChecksPath, s.checks)
	s.mux.HandleFunc("POST "+checkapi.ReleasePath, s.lease(sluice.Release))
	s.mux.HandleFunc("POST "+checkapi.RenewPath, s.lease(sluice.Renew))
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET "+storeHealthPath, s.storeHealth)
	s.mux.HandleFunc("GET "+openAPIPath, serveOpenAPI)
	if s.metrics != nil {
		s.mux.Handle("GET /metrics", s.metrics.Handler())
	}
	if s.configStatus != nil {
		s.mux.HandleFunc("GET /v1/config", s.configz)
	}
	s.mux.HandleFunc("PUT "+checkapi.OverridesPath, s.admin(s.putOverride))
	s.mux.HandleFunc("DELETE "+checkapi.OverridesPath, s.admin(s.deleteOverride))
	s.mux.HandleFunc("GET "+checkapi.OverridesPath, s.admin(s.listOverrides))
	s.mux.HandleFunc("GET "+checkapi.RLQSPath, s.admin(s.listRLQS))
	s.mux.HandleFunc("GET /ui", s.admin(s.uiPage))
	s.mux.Handle("GET /ui/{$}", http.RedirectHandler("/ui", http.StatusMovedPermanently))
	s.mux.HandleFunc("GET /ui/{file}", s.admin(s.uiAsset))
	s.mux.HandleFunc("GET /ui/api/state", s.admin(s.uiState))
	s.mux.HandleFunc("POST /ui/api/simulate", s.admin(s.uiSimulate))
}

// newCore returns core, or with none the edge core of s's Limiter.
func (s *Server) newCore(core *edge.Core) (*edge.Core, error) {
	if core != nil {
		if core.Limiter() != s.lim {
			return nil, errors.New("server: New: Core decides with another Limiter than lim")
		}
		return core, nil
	}
	var count, settled edge.CountFunc
	if s.metrics != nil {
		count, settled = s.metrics.count, s.metrics.settled
	}
	return edge.New(s.lim, edge.Options{Deadline: s.decide, Count: count, Settled: settled, Clock: s.clock, Logger: s.log, Prefix: "server"})
}

// checkPattern is the check API's route, as the mux and the metrics name
// it.
const checkPattern = "POST " + checkapi.CheckPath

// ServeHTTP routes r and logs it. Unknown paths get 404, known paths with
// another method 405 with Allow.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := s.clock.Now()
	lw := logWriterPool.Get().(*logWriter)
	*lw = logWriter{ResponseWriter: w, status: http.StatusOK}
	s.mux.ServeHTTP(lw, r)
	s.logRequest(r.Context(), r.Method, r.URL.Path, lw, s.clock.Now().Sub(start))
	if s.metrics != nil {
		handler := r.Pattern // set by the mux; "" for 404 and 405
		if handler == "" {
			handler = "unmatched"
		}
		s.metrics.countRequest(handler, lw.status)
	}
	*lw = logWriter{}
	logWriterPool.Put(lw)
}

// logWriter records what the request log needs. The check handler fills
// in the decision fields.
type logWriter struct {
	http.ResponseWriter
	status   int
	policy   string // the policy, or the policies joined by ","
	pseudo   string // the pseudonymous subject, never the raw one
	cost     int64
	refund   bool
	replayed bool
	token    string // the ID of the token the request presented
	outcome  string
	reason   string
	hasCheck bool
}

var logWriterPool = sync.Pool{New: func() any { return new(logWriter) }}

func (lw *logWriter) WriteHeader(code int) {
	lw.status = code
	lw.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (lw *logWriter) Unwrap() http.ResponseWriter { return lw.ResponseWriter }

func (s *Server) logRequest(ctx context.Context, method, path string, lw *logWriter, took time.Duration) {
	level := slog.LevelDebug
	switch {
	case lw.status >= 500:
		level = slog.LevelWarn
	case lw.status >= 400 && lw.status != http.StatusTooManyRequests:
		level = slog.LevelInfo
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	// Store failures fail every request while they last: the edge core
	// logs ten lines a second, with the count of those held back; a
	// client's 4xx lines are held to the same here.
	attrs := make([]slog.Attr, 0, 12)
	if level == slog.LevelInfo {
		ok, suppressed := s.clientErrs.Allow(s.clock.Now())
		if !ok {
			return
		}
		if suppressed > 0 {
			attrs = append(attrs, slog.Int64("suppressed_since_last", suppressed))
		}
	}
	attrs = append(attrs,
		slog.String("method", method),
		slog.String("path", path),
		slog.Int("status", lw.status),
		slog.Duration("duration", took),
	)
	if lw.hasCheck {
		attrs = append(attrs, slog.String("policy", lw.policy), slog.String("subject", lw.pseudo), slog.Int64("cost", lw.cost), slog.String("outcome", lw.outcome))
		if lw.refund {
			attrs = append(attrs, slog.Bool("refund", true))
		}
		if lw.replayed {
			attrs = append(attrs, slog.Bool("replayed", true))
		}
	}
	if lw.token != "" {
		attrs = append(attrs, slog.String("token", lw.token))
	}
	if lw.reason != "" {
		attrs = append(attrs, slog.String("reason", lw.reason))
	}
	s.core.Log(ctx, level, "request", attrs...)
}

// errNoPolicies is the answer of an admin request when the configuration
// has no policies of its own.
var errNoPolicies = fmt.Errorf("sluice: %w: the configuration has no policies", policyerr.ErrUnknownPolicy)

// shown returns the IDs of every policy the server serves, the check
// API's and then the rules files', and the lookup of one: what the
// dashboard lists.
func (s *Server) shown() ([]string, func(string) (sluice.Policy, bool)) {
	ids := s.policies()
	if s.envoy == nil {
		return ids, s.policy
	}
	for _, id := range s.envoy.Policies() {
		if _, dup := s.policy(id); !dup {
			ids = append(ids, id)
		}
	}
	return ids, func(id string) (sluice.Policy, bool) {
		if p, ok := s.policy(id); ok {
			return p, true
		}
		return s.envoy.Policy(id)
	}
}

// policy returns the policy id, when the Limiter has it.
func (s *Server) policy(id string) (sluice.Policy, bool) {
	if s.lim == nil {
		return sluice.Policy{}, false
	}
	return s.lim.Policy(id)
}

// policies returns the Limiter's policy ids in order, none without one.
func (s *Server) policies() []string {
	if s.lim == nil {
		return nil
	}
	return s.lim.Policies()
}
