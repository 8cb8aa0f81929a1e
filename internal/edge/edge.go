// Package edge is the one decision core of sluice's edges: the net/http
// middleware (httplimit), the gRPC interceptors (grpclimit), the server's
// reverse proxy, its Envoy rate-limit service and its check API. An edge
// turns its request into a Rule (which policies, what cost, which
// operation, the failure mode) and a Subject (the pseudonym); the Core
// asks the Limiter within a deadline and returns an Action: admit, limit
// (with its Retry-After), fail open, fail closed, each possibly answered
// by the local fallback. The edge keeps only request → (Rule, Subject)
// and Action → response: the Action carries its HTTP status, its header
// fields and its RFC 9457 problem body.
//
// The Core counts every spending decision once (Options.Count, or the
// counter a request's context carries, see WithCount), whatever edge took
// it and whichever file defined the policy, and throttles the warnings of
// failed decisions on the clock it is given.
package edge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
)

// DefaultDeadline is how long an edge waits for a decision unless told
// otherwise: long enough that a burst of 500 concurrent requests on a busy
// two-core machine with a healthy local Redis gets no 503 (100ms gave
// about half of them one), short enough that a failing store is answered
// by the failure mode well within a second, and the store's circuit
// breaker soon answers at once.
const DefaultDeadline = 500 * time.Millisecond

// CountFunc counts one spending decision: o, the Limiter's outcome, once
// for each of policies. classes, when not nil, says per policy the
// priority class the decision counts as there (Core.counted): the class
// the request named if that policy declares it, else "default"; "" for
// a policy that declares no classes. It is nil when none of policies
// declares classes, and for a settle. Every class is one the config
// declares, never a name only the request carried. It must be safe for
// concurrent use.
type CountFunc func(policies, classes []string, o sluice.Outcome)

// Options configure a Core. The zero value means the defaults.
type Options struct {
	// Fallback is the store of the local fallback: when the Limiter cannot
	// decide, a Rule whose Mode is failure.Local is decided on it, under
	// the same policy IDs, each holding LocalShare of its limit. Default:
	// nil, no rule may fail local.
	Fallback sluice.Store
	// LocalShare is the share of each policy's limit the local fallback
	// holds, in (0, 1]. Default: 1.
	LocalShare float64
	// Deadline bounds how long a decision (a release, a refund) waits for
	// the Limiter. Default: DefaultDeadline.
	Deadline time.Duration
	// Count, when set, counts every spending decision (Spend, Acquire and
	// Estimate): the Limiter's outcome, once per policy of the rule.
	// Default: nil.
	Count CountFunc
	// Settled, when set, counts every Settle (settle.go): the Limiter's
	// outcome, its Statuses (or Status) saying what was charged, given
	// back and owed per policy. Default: nil.
	Settled CountFunc
	// Clock times the throttle of warnings. Default: the system clock.
	Clock sluice.Clock
	// Logger receives the records of Log, warnings at most ten a second
	// with the count held back. Default: slog.Default().
	Logger *slog.Logger
	// Prefix starts every option error, e.g. "httplimit". Default: "edge".
	Prefix string
}

// Core decides for an edge. Create it with New; immutable but for its
// throttle, and safe for concurrent use. It owns no goroutines.
type Core struct {
	lim      *sluice.Limiter
	fallback *sluice.Limiter // nil without Options.Fallback
	deadline time.Duration
	count    CountFunc
	settled  CountFunc
	clock    sluice.Clock
	log      *slog.Logger
	prefix   string
	warnings logthrottle.Throttle
	classed  map[string]map[string]int // the Priorities of lim's policies that declare classes; nil for none
}

// New returns the Core deciding with lim (nil: a configuration without
// policies, every decision Incompatible).
func New(lim *sluice.Limiter, opts Options) (*Core, error) {
	c := &Core{
		lim:      lim,
		deadline: cmp.Or(opts.Deadline, DefaultDeadline),
		count:    opts.Count,
		settled:  opts.Settled,
		clock:    opts.Clock,
		log:      cmp.Or(opts.Logger, slog.Default()),
		prefix:   cmp.Or(opts.Prefix, "edge"),
		classed:  classed(lim),
	}
	if c.clock == nil {
		c.clock = clock.System{}
	}
	if opts.Deadline < 0 {
		return nil, c.OptionError("Deadline", opts.Deadline, "must not be negative")
	}
	if opts.Fallback == nil {
		if opts.LocalShare != 0 {
			return nil, c.OptionError("LocalShare", opts.LocalShare, "is set, but Fallback is nil")
		}
		return c, nil
	}
	share := cmp.Or(opts.LocalShare, 1)
	if !(share > 0 && share <= 1) {
		return nil, c.OptionError("LocalShare", share, "must be in (0, 1]")
	}
	fb, err := localFallback(lim, opts.Fallback, share)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.prefix, err)
	}
	c.fallback = fb
	return c, nil
}

// OptionError is an invalid option of the edge: where it is, its value and
// the rule it breaks, e.g. `httplimit: Routes[0].Cost = -1: must not be
// negative`.
func (c *Core) OptionError(at string, value any, rule string) error {
	return fmt.Errorf("%s: %s = %v: %s", c.prefix, at, value, rule)
}

// Limiter is the Limiter the Core decides with; nil for none.
func (c *Core) Limiter() *sluice.Limiter { return c.lim }

// Deadline is how long a decision waits for the Limiter.
func (c *Core) Deadline() time.Duration { return c.deadline }

// Kind is what an edge does with a request, in its log and metric
// spelling (httplimit.Decision.Action), e.g. "failed_closed".
type Kind string

// The kinds of Action.
const (
	undecided Kind = ""
	// Admit: the request goes on (the Limiter or the local fallback
	// admitted it).
	Admit Kind = "admitted"
	// Limit: the request is refused, 429 with Retry-After.
	Limit Kind = "limited"
	// FailOpen: no decision, and the rule fails open: the request goes on.
	FailOpen Kind = "failed_open"
	// FailClosed: no decision (nor from the local fallback), and the rule
	// fails closed: 503 with Retry-After: 1.
	FailClosed Kind = "failed_closed"
)

// Action is what the Core decided for one request.
type Action struct {
	// Kind is what the edge is to do.
	Kind Kind
	// Outcome is the Limiter's.
	Outcome sluice.Outcome
	// Local reports that the Limiter could not decide and the local
	// fallback was asked; LocalOutcome is its answer.
	Local        bool
	LocalOutcome sluice.Outcome
	// Status is the HTTP status of the answer: 0 when the request goes on,
	// 429 limited, 503 failed closed.
	Status int
	// RetryAfter is the Retry-After of a refusal in whole seconds, rounded
	// up, at least 1; 0 when the request goes on.
	RetryAfter int64
	// Lease is the lease an admission holds on the rule's concurrency
	// policies, to give back with Core.Release; the zero Lease for none.
	Lease sluice.Lease
	// Delay is how long a queued request was held for its booked slot
	// (queue.go); 0 when it was decided at once.
	Delay time.Duration
	// Queue is what the rule's queue did with the request (QueueWaited,
	// QueuePastDelay, QueueFull, QueueAbandoned); "" for a request that
	// fit now, or a rule without a queue.
	Queue string
}

// LimitField is the RateLimit field of the deciding outcome, e.g.
// `"login";r=2;t=60`; "" when nothing was decided. It is written when
// asked: the Envoy service and the check API answer in fields of their
// own, and a field built for every decision was a string they dropped.
func (a *Action) LimitField() string {
	if o := a.Decided(); decided(o) {
		return string(ratelimitheader.AppendLimitField(nil, *o))
	}
	return ""
}

// Decided is the outcome that decided: the local fallback's when it was
// asked, else the Limiter's.
func (a *Action) Decided() *sluice.Outcome {
	if a.Local {
		return &a.LocalOutcome
	}
	return &a.Outcome
}

// Subject is who a request is limited as, pseudonymized by the edge.
type Subject struct {
	// ID is the pseudonym the Limiter sees.
	ID string
	// Previous are the subject's pseudonyms under older keys, during a
	// key rotation.
	Previous []string
	// EvaluationID identifies a request across its retries; "" for none.
	EvaluationID string
	// Priority is the request's priority class (sluice.Request.Priority);
	// "" for the default.
	Priority string
}

// errNoPolicies is the outcome of every decision of a Core without a
// Limiter.
var errNoPolicies = fmt.Errorf("sluice: %w: the configuration has no policies", policyerr.ErrUnknownPolicy)

// Check asks the Limiter req within the Core's deadline and counts it when
// it spends: the decision of an edge that builds its own requests (the
// check API, the Envoy service). Prefer Decide.
func (c *Core) Check(ctx context.Context, req sluice.Request) sluice.Outcome {
	if c.lim == nil {
		return sluice.Outcome{Kind: sluice.Incompatible, Err: errNoPolicies}
	}
	dctx, cancel := withLazyDeadline(ctx, time.Now().Add(c.deadline))
	o := c.lim.Check(dctx, req)
	cancel()
	switch req.Op {
	case sluice.Spend, sluice.Acquire, sluice.Estimate, sluice.Book:
		c.counted(ctx, &req, o)
	case sluice.Settle:
		c.countSettle(ctx, &req, o)
	}
	return o
}

// counted counts o for req's policies on the Core's counter and the
// context's, if any.
func (c *Core) counted(ctx context.Context, req *sluice.Request, o sluice.Outcome) {
	f, _ := ctx.Value(countKey{}).(CountFunc)
	if c.count == nil && f == nil {
		return
	}
	ids := req.Policies
	if req.Policy != "" {
		ids = []string{req.Policy}
	}
	classes := c.classes(ids, req.Priority)
	if c.count != nil {
		c.count(ids, classes, o)
	}
	if f != nil {
		f(ids, classes, o)
	}
}

// classes returns the priority class a request of class counts as on
// each of ids (see CountFunc), or nil when none of them declares
// classes: a class is a label value only when the policy declares it.
func (c *Core) classes(ids []string, class string) []string {
	if c.classed == nil {
		return nil
	}
	var out []string
	for i, id := range ids {
		shares, ok := c.classed[id]
		if !ok {
			continue
		}
		if out == nil {
			out = make([]string, len(ids))
		}
		out[i] = algorithm.DefaultClass
		if _, declared := shares[class]; declared {
			out[i] = class
		}
	}
	return out
}

// classed returns the Priorities of lim's policies that declare
// priority classes, by ID; nil when none does (or lim is nil).
func classed(lim *sluice.Limiter) map[string]map[string]int {
	if lim == nil {
		return nil
	}
	var out map[string]map[string]int
	for _, id := range lim.Policies() {
		if p, _ := lim.Policy(id); len(p.Priorities) > 0 {
			if out == nil {
				out = map[string]map[string]int{}
			}
			out[id] = p.Priorities
		}
	}
	return out
}

type countKey struct{}

// WithCount returns ctx carrying f: every spending decision a Core takes
// under it is also counted by f (the server's proxy counts the decisions
// of the httplimit middleware it wraps so).
func WithCount(ctx context.Context, f CountFunc) context.Context {
	return context.WithValue(ctx, countKey{}, f)
}

// Decide asks the Limiter about one request of rule r for subject s and
// returns what the edge is to do (see DecideRequest).
func (c *Core) Decide(ctx context.Context, r *Rule, s Subject) Action {
	if r.queue != nil {
		return c.decideQueued(ctx, r, s)
	}
	return c.DecideRequest(ctx, request(r.Op, r, s), r.Mode)
}

// DecideRequest asks the Limiter req, counts it when it spends, and
// returns what the edge is to do. When the Limiter cannot decide, mode
// answers: FailOpen admits, FailClosed refuses (503), FailLocal asks the
// local fallback the same, whose failure to decide fails closed. An
// Incompatible outcome is answered by mode too: the edge that builds its
// own requests tells the caller's fault apart first (Rejected).
func (c *Core) DecideRequest(ctx context.Context, req sluice.Request, mode failure.Mode) Action {
	a := Action{Outcome: c.Check(ctx, req)}
	switch a.Kind = verdict(&a.Outcome); a.Kind {
	case Admit, Limit:
		settle(&a)
		return a
	}
	switch {
	case mode == failure.Open:
		a.Kind = FailOpen
	case mode == failure.Local && c.fallback != nil:
		a.Local = true
		dctx, cancel := context.WithTimeout(ctx, c.deadline)
		a.LocalOutcome = c.fallback.Check(dctx, req)
		cancel()
		if a.Kind = verdict(&a.LocalOutcome); a.Kind == undecided {
			a.Kind = FailClosed
		}
	default:
		a.Kind = FailClosed
	}
	settle(&a)
	return a
}

// With returns a Core deciding with lim instead, counting and logging as
// c does, without a local fallback.
func (c *Core) With(lim *sluice.Limiter) *Core {
	return &Core{lim: lim, deadline: c.deadline, count: c.count, settled: c.settled, clock: c.clock, log: c.log, prefix: c.prefix, classed: classed(lim)}
}

// request is the Limiter request of op on r's policies for s: every
// sluice.Request of a rule is built here.
func request(op sluice.Op, r *Rule, s Subject) sluice.Request {
	req := sluice.Request{Op: op, Subject: s.ID, Previous: s.Previous, Cost: r.Cost, EvaluationID: s.EvaluationID, Priority: s.Priority}
	if len(r.Policies) == 1 {
		req.Policy = r.Policies[0]
	} else {
		req.Policies = r.Policies
	}
	return req
}

// Release gives back the lease a's admission holds, if any, with a
// deadline of its own: the request's context may be canceled already (the
// client went away). A failure is logged (throttled).
func (c *Core) Release(ctx context.Context, a *Action) {
	lease := a.Lease
	if lease.ID == "" {
		return
	}
	lim := c.lim
	if a.Local {
		lim = c.fallback
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.deadline)
	defer cancel()
	if o := lim.Check(ctx, sluice.Request{Op: sluice.Release, Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID}); o.Kind != sluice.Allowed {
		c.Log(ctx, slog.LevelWarn, "sluice: lease not released; it is held until its lease_ttl passes",
			slog.String("policies", strings.Join(lease.Policies, ",")), slog.String("subject", lease.Subject),
			slog.String("outcome", o.Kind.String()), slog.Any("error", o.Err))
	}
}

// errNothingSpent is the error of a Refund for a request that spent
// nothing.
var errNothingSpent = errors.New("the request spent nothing to refund")

// Refund gives back what a's admission of rule r spent for s, on the
// limiter that admitted it, with a deadline of its own. Concurrency
// policies are left alone (their lease is released). A request that spent
// nothing is Incompatible, wrapping sluice.ErrInvalidRequest.
func (c *Core) Refund(ctx context.Context, r *Rule, a *Action, s Subject) sluice.Outcome {
	lim := c.lim
	if a.Local {
		lim = c.fallback
	}
	if a.Kind != Admit {
		return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("%s: %w: %w", c.prefix, errNothingSpent, sluice.ErrInvalidRequest)}
	}
	rated := &Rule{Cost: r.Cost}
	for _, id := range r.Policies {
		if p, _ := lim.Policy(id); p.Algorithm != sluice.Concurrency {
			rated.Policies = append(rated.Policies, id)
		}
	}
	if len(rated.Policies) == 0 {
		return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("%s: %w: %w", c.prefix, errNothingSpent, sluice.ErrInvalidRequest)}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.deadline)
	defer cancel()
	return lim.Check(ctx, request(sluice.Refund, rated, s))
}

// Log logs msg at level; warnings (the failures that fail every request
// while the store is down) at most ten a second on the Core's clock, the
// first after a pause carrying the count of those held back.
func (c *Core) Log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if !c.log.Enabled(ctx, level) {
		return
	}
	if level >= slog.LevelWarn {
		ok, suppressed := c.warnings.Allow(c.clock.Now())
		if !ok {
			return
		}
		if suppressed > 0 {
			attrs = append([]slog.Attr{slog.Int64("suppressed_since_last", suppressed)}, attrs...)
		}
	}
	c.log.LogAttrs(ctx, level, msg, attrs...)
}

// What follows is the one place the Core reads an Outcome's fields (Kind,
// Err, Status and its numbers, Statuses, Lease): a change to
// sluice.Outcome is answered here.

// verdict is the Action kind of a decided outcome o: Admit, Limit, or
// undecided (Unavailable, Indeterminate, Incompatible) for the failure
// mode to answer.
func verdict(o *sluice.Outcome) Kind {
	switch o.Kind {
	case sluice.Allowed:
		return Admit
	case sluice.Denied:
		return Limit
	}
	return undecided
}

// decided reports whether o carries the store's numbers.
func decided(o *sluice.Outcome) bool {
	return o.Kind == sluice.Allowed || o.Kind == sluice.Denied
}

// Rejected reports whether o is the request's fault (Incompatible, but
// not corrupt state): no failure mode applies, the edge answers an error
// of the caller.
func Rejected(o *sluice.Outcome) bool {
	return o.Kind == sluice.Incompatible && !errors.Is(o.Err, sluice.CorruptState)
}

// SetLegacyHeaders sets the X-RateLimit-Limit, -Remaining and -Reset
// (seconds from now) fields of a's deciding outcome, when it was decided.
func SetLegacyHeaders(h http.Header, a *Action) {
	if o := a.Decided(); decided(o) {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(o.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(o.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ratelimitheader.CeilSeconds(o.ResetAfter), 10))
	}
}

// leaseOf is the lease an admission holds, the zero Lease for none.
func leaseOf(o *sluice.Outcome) sluice.Lease { return o.Lease }

// retryAfter is the wait of a denial.
func retryAfter(o *sluice.Outcome) time.Duration { return o.RetryAfter }

// Statuses is every policy's status of o.
func Statuses(o *sluice.Outcome) []sluice.Status {
	if len(o.Statuses) == 0 {
		return []sluice.Status{o.Status}
	}
	return o.Statuses
}

// Violated lists the policies that denied o.
func Violated(o *sluice.Outcome) []string {
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

func appendPolicyItem(b []byte, p sluice.Policy) []byte {
	return ratelimitheader.AppendPolicyItem(b, p)
}

// settle fills in what a's edge answers with: its status and
// Retry-After (its RateLimit field is LimitField's).
func settle(a *Action) {
	o := a.Decided()
	switch a.Kind {
	case Admit:
		a.Lease = leaseOf(o)
	case Limit:
		a.Status, a.RetryAfter = http.StatusTooManyRequests, ratelimitheader.RetryAfterSeconds(retryAfter(o))
	case FailClosed:
		a.Status, a.RetryAfter = http.StatusServiceUnavailable, 1
	}
}
