// Package rls is Envoy's rate-limit service (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over a
// sluice Limiter, with rules read by package rules, and the standard
// gRPC health service.
//
// A request names a domain and descriptors. Each descriptor is matched to
// at most one rule (rules.Config.Match); a rule named in another
// matched rule's replaces is dropped. The cost is the descriptor's
// hits_addend when it has one, else the request's, where 0 or absent
// means 1; a descriptor's hits_addend of 0 checks without spending (a
// peek: OVER_LIMIT when the next unit would be denied). The subject
// of a descriptor is the pseudonym of its domain and of the entries its
// rule does not fix (the values matched by a key alone or a wildcard
// without share_threshold), so no raw descriptor value reaches a store,
// a log line or a metric.
//
// A descriptor's limit (RateLimitDescriptor.limit) in a known domain
// replaces the rule that matches it, or applies where none does, as in
// envoyproxy/ratelimit: its numbers (requests_per_unit per unit ×
// unit_multiplier, at most 24h) are a fixed window aligned to the clock
// whose policy ID is derived from them, so each set of numbers counts on
// a counter of its own; every entry of the descriptor names the budget.
// An override is never shadow, unlimited or replaced.
//
// Descriptors of one request with the same subject and cost are decided
// in one Limiter.Check over their policies, all or nothing: when one is
// over its limit nothing is spent on the others. The engine decides one
// cost per evaluation, so descriptors of one subject asking for
// different costs (or one with a limit override) are decided one check
// each: those that spend nothing first, then in request order, and once
// one of the subject's is denied the rest of that subject only check.
// Descriptors with different subjects are decided separately, as
// envoyproxy/ratelimit decides every descriptor. A descriptor repeated in
// one request (same rule, subject and cost) is counted once and answered
// alike.
//
// Each descriptor gets a status: OK or OVER_LIMIT with current_limit,
// limit_remaining and duration_until_reset; OK without current_limit
// when no rule matches (an unknown domain or descriptor, as
// envoyproxy/ratelimit answers); OK with limit_remaining 4294967295 for
// unlimited rules; OK, whatever the verdict, for shadow_mode rules. The
// overall code is OVER_LIMIT when any status of a rule outside quota_mode
// is, or when every quota_mode descriptor's is (envoyproxy/ratelimit's
// quota_mode); with State.ResponseMetadata the answer carries their
// dynamic metadata (see dynamicMetadata). The answer carries the
// RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers for every rule the store decided,
// shadow_mode ones included (a shadow answer carries what an enforced
// one would), and Retry-After when an enforced rule is over the limit,
// as response_headers_to_add.
//
// When the store cannot decide (an Unavailable or Indeterminate outcome,
// or corrupt state), the policies' failure mode picks the answer: if
// every policy of the descriptors concerned is open, they are answered OK
// (without limit_remaining); otherwise the call fails with gRPC status
// UNAVAILABLE, so Envoy's rate_limit filter applies its own
// failure_mode_deny (deny when true, allow when false). The response code
// UNKNOWN is never sent: Envoy treats it as OK.
//
// In-flight limits (a rule's sluice_in_flight, rules.Rule.InFlight)
// are leases: the request-time call acquires one, named by the pseudonym
// of the descriptor's last value (Envoy's x-request-id), for the subject
// of the entries above it; Envoy's stream-done call (apply_on_stream_done)
// sends the same descriptor with is_negative_hits or a hits_addend of 0,
// and releases it; a lease whose release never comes expires after the
// policy's lease TTL. Each such descriptor is decided in a check of its
// own.
//
// Costs settled on stream done (a rule's sluice_settle,
// rules.Rule.Settles): the request-time call spends an estimate, the
// stream-done call settles it at the actual cost; settle.go says how the
// two calls find each other. A settle is never denied, whatever its
// cost: the store charges it up to its debt bound.
//
// Priority classes (a rule's sluice_priorities): a descriptor names its
// class in an entry of key rules.PriorityKey, removed before
// matching; priority.go says how it is decided.
//
// A spend above what a descriptor's class may ever spend (its rule's, or
// a tenant plan's lower limit) is OVER_LIMIT, never an error: Envoy's
// failure_mode_deny: false admits what an error answers. The store
// refuses it before it reads any state (algorithm.ErrCostTooHigh), as it
// refuses any edge's: the check it is decided in is denied whole, every
// descriptor of it OVER_LIMIT, and the subject's later checks only peek,
// as after any denial.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/subject"
)

// ServiceName is the gRPC name of the rate-limit service, also a name the
// health service answers for.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// SubjectKind is the kind folded into every descriptor's pseudonym.
const SubjectKind = "envoy"

// State is what the service decides with: the rules, a Limiter holding
// exactly the rules' policies (nil when they have none: every rule is
// unlimited or allows 0), the Store it decides on (for limit
// overrides, each of which gets a policy and a Limiter of its own) and
// the pseudonymizer; Core, when set, is the edge core deciding with
// Limiter, counting and bounding every decision (internal/wiring builds
// serve's; default: one with the edge core's defaults and the Service's
// logger). Swap replaces it as a whole; a request in flight finishes
// with the State it started with.
type State struct {
	Rules         *rules.Config
	Limiter       *sluice.Limiter
	Store         sluice.Store
	Pseudonymizer *subject.Pseudonymizer
	Core          *edge.Core
	// MaxDescriptors bounds the descriptors of one request, and
	// MaxEntries the entries of one descriptor: a request over either is
	// refused InvalidArgument naming the bound, before any store call.
	// Default (0): DefaultMaxDescriptors, DefaultMaxEntries.
	MaxDescriptors, MaxEntries int
	// ResponseMetadata sends dynamic metadata with every answer, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does (see
	// dynamicMetadata). Default: false.
	ResponseMetadata bool

	core      *edge.Core // decides with Limiter: Core, or one Swap made
	mu        sync.Mutex
	overrides map[string]*overrideLimit // by policy ID
}

func (st *State) check() error {
	switch {
	case st == nil:
		return errors.New("state is nil")
	case st.Rules == nil:
		return errors.New("rules are nil")
	case st.Limiter == nil && len(st.Rules.Policies()) > 0:
		return errors.New("limiter is nil")
	case st.Store == nil:
		return errors.New("store is nil")
	case st.Pseudonymizer == nil:
		return errors.New("pseudonymizer is nil")
	case st.Core != nil && st.Core.Limiter() != st.Limiter:
		return errors.New("the core decides with another limiter than Limiter")
	}
	for _, p := range st.Rules.Policies() {
		if _, ok := st.Limiter.Policy(p.ID); !ok {
			return fmt.Errorf("the limiter lacks policy %q of the rules", p.ID)
		}
	}
	return nil
}

// bounds checks req's descriptors against st's bounds: at least one, at
// most MaxDescriptors, each with at most MaxEntries entries.
func (st *State) bounds(req *rlspb.RateLimitRequest) error {
	maxD, maxE := st.MaxDescriptors, st.MaxEntries
	if maxD <= 0 {
		maxD = DefaultMaxDescriptors
	}
	if maxE <= 0 {
		maxE = DefaultMaxEntries
	}
	ds := req.GetDescriptors()
	switch {
	case len(ds) == 0:
		return errors.New("descriptors must not be empty")
	case len(ds) > maxD:
		return fmt.Errorf("descriptors: %d: at most %d per request (envoy.max_descriptors)", len(ds), maxD)
	}
	for i, d := range ds {
		if n := len(d.GetEntries()); n > maxE {
			return fmt.Errorf("descriptors[%d].entries: %d: at most %d per descriptor (envoy.max_entries)", i, n, maxE)
		}
	}
	return nil
}

// Options configure a Service. Logger is required.
type Options struct {
	// Logger receives one debug line per request and warnings for
	// failures. Required.
	Logger *slog.Logger
	// Metrics, when set, counts answers. Default: nil, no metrics.
	Metrics *Metrics
}

// Service answers ShouldRateLimit. Safe for concurrent use; it owns no
// goroutines.
type Service struct {
	rlspb.UnimplementedRateLimitServiceServer
	state   atomic.Pointer[State]
	log     *slog.Logger
	metrics *Metrics
	health  *health.Server
}

// New returns a Service deciding with st.
func New(st *State, opts Options) (*Service, error) {
	if opts.Logger == nil {
		return nil, errors.New("rls: New: logger is nil")
	}
	s := &Service{log: opts.Logger, metrics: opts.Metrics, health: health.NewServer()}
	if err := s.Swap(st); err != nil {
		return nil, err
	}
	return s, nil
}

// Swap makes st the State of every request that starts from now on.
func (s *Service) Swap(st *State) error {
	if err := st.check(); err != nil {
		return fmt.Errorf("rls: %w", err)
	}
	st.core = st.Core
	if st.core == nil {
		core, err := edge.New(st.Limiter, edge.Options{Logger: s.log, Prefix: "rls"})
		if err != nil {
			return err
		}
		st.core = core
	}
	s.state.Store(st)
	return nil
}

// Register registers the rate-limit service and the health service
// (grpc.health.v1.Health, SERVING for "" and ServiceName) on g.
func (s *Service) Register(g *grpc.Server) {
	rlspb.RegisterRateLimitServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// Shutdown answers NOT_SERVING to health checks from now on, so clients
// move away before the server stops.
func (s *Service) Shutdown() { s.health.Shutdown() }

// The default bounds of one request (State.MaxDescriptors, MaxEntries).
// Envoy sends one descriptor per rate_limits entry of a route, each with
// an entry per action: a handful of each. envoyproxy/ratelimit bounds
// neither, so a route config mistake (or a client of the service) could
// make one request of 10 000 descriptors, 10 000 store calls.
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 32
)

// descriptor is one request descriptor on its way to an answer.
type descriptor struct {
	rule     *rules.Rule
	core     *edge.Core // decides rule: the State's, or a limit override's
	override bool       // rule is a limit override's
	// dup is 1 + the index of the earlier descriptor this one repeats
	// (same rule, subject, cost and kind): it is counted once, with that
	// one, and answered alike. 0 for none.
	dup      int
	subject  string
	previous []string // subject under older keys during a key rotation
	cost     int64
	refund   bool
	// lease names the lease of an in-flight rule (Rule.InFlight), which
	// the descriptor acquires, or gives back when release is set.
	lease   string
	release bool
	settle  settleCall // a settling rule's estimate or settle (settle.go)
	// priority is the class the descriptor is decided as
	// (sluice.Request.Priority; "" for the default class), and
	// unknownClass reports that it named one its rule does not declare,
	// decided as the default (priority.go).
	priority     string
	unknownClass bool
	status       *rlspb.RateLimitResponse_DescriptorStatus
	// decided is the store's verdict, for the response headers (a
	// shadow rule's too: its answer carries what an enforced one would):
	// verdict, or a repeated descriptor's.
	decided *sluice.Status
	verdict sluice.Status
	// replaced is the rule another matched rule's replaces dropped (rule
	// is then nil): counted as replaced, not as no rule.
	replaced *rules.Rule
	// failedOpen: the store could not decide and the rule fails open.
	failedOpen bool
}

// group is the descriptors decided in one Limiter.Check.
type group struct {
	core     *edge.Core
	subject  string
	previous []string
	cost     int64
	refund   bool
	lease    string // an in-flight rule's: acquired, or released
	release  bool
	quota    bool // a quota_mode descriptor's: decided alone, after the others
	shadow   bool
	peek     bool // a descriptor of the subject is denied without the store
	members  []int
	settle   settleCall // a settling rule's estimate or settle (settle.go)
	priority string     // the members' class (descriptor.priority)
}

func (g *group) has(ds []descriptor, id string) bool {
	for _, i := range g.members {
		if ds[i].rule.Policy.ID == id {
			return true
		}
	}
	return false
}

// givesBack reports whether g gives back what was spent (a refund or a
// lease's release): it is never only checked, and never a denial.
func (g *group) givesBack() bool { return g.refund || g.release || g.settle.op == sluice.Settle }

// errUnavailable is the answer when the store cannot decide for a
// fail-closed policy.
func errUnavailable(reason string) error {
	return status.Error(codes.Unavailable, "sluice: the store cannot decide and the policy fails closed: "+reason)
}

// ShouldRateLimit decides req; see the package documentation.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	resp, err := s.shouldRateLimit(ctx, req)
	if s.metrics != nil {
		s.metrics.countRequest(resp, err)
	}
	return resp, err
}

// shouldRateLimit decides req with the State it starts with: it matches
// the descriptors, answers those that need no store, asks the store for
// the rest, one group at a time, and builds the response.
func (s *Service) shouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	st := s.state.Load()
	domain := req.GetDomain()
	if domain == "" {
		return nil, status.Error(codes.InvalidArgument, "sluice: domain must not be empty")
	}
	if err := st.bounds(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, "sluice: "+err.Error())
	}
	sc := getScratch(len(req.Descriptors))
	defer sc.release()
	ds, err := match(st, req, sc)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "sluice: "+err.Error())
	}
	if err := s.decideGroups(ctx, ds, sc); err != nil {
		return nil, err
	}
	s.countUnsettled(ctx, ds)
	s.countUnknownClasses(ctx, ds)
	for i := range ds {
		if d := &ds[i]; d.dup > 0 {
			e := &ds[d.dup-1]
			d.status = proto.Clone(e.status).(*rlspb.RateLimitResponse_DescriptorStatus)
			d.decided, d.failedOpen = e.decided, e.failedOpen
		}
	}
	resp := s.response(ds, sc.rp)
	if st.ResponseMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, ds)
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "envoy rate limit", slog.String("domain", domain), slog.Int("descriptors", len(ds)), slog.String("overall_code", resp.OverallCode.String()))
	}
	return resp, nil
}

// decideGroups asks the store for every group of ds, in order. Once a
// subject is denied, its later groups only check (nothing more is
// spent); once any enforced descriptor that is not in quota_mode is
// over, the request is over whatever its quota_mode descriptors say, so
// they (decided last) only check too. A quota_mode descriptor over its
// limit stops nothing.
func (s *Service) decideGroups(ctx context.Context, ds []descriptor, sc *scratch) error {
	groups := groupDescriptors(ds, sc)
	denied := map[string]bool{} // subjects with a group the store denied
	over := false               // an enforced descriptor outside quota_mode is over
	for i := range ds {
		if d := &ds[i]; d.status != nil && d.rule != nil && !d.rule.Shadow && !d.rule.QuotaMode {
			over = over || d.status.Code == rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	for _, g := range groups {
		if (denied[g.subject] || g.quota && over) && !g.shadow && !g.givesBack() {
			g.peek = true // nothing more is spent once denied
		}
		if err := s.decide(ctx, ds, g, sc.rp); err != nil {
			return err
		}
		if g.quota || g.shadow || g.givesBack() {
			continue
		}
		for _, i := range g.members {
			o := ds[i].status.Code == rlspb.RateLimitResponse_OVER_LIMIT
			denied[g.subject], over = denied[g.subject] || o, over || o
		}
	}
	return nil
}

// match returns req's descriptors with their rules, costs and subjects.
// A descriptor whose rule another matched rule replaces has no rule:
// it is neither decided nor spent. The error is a limit override sluice
// cannot apply. The descriptors and buffers are sc's.
func match(st *State, req *rlspb.RateLimitRequest, sc *scratch) ([]descriptor, error) {
	domain := req.GetDomain()
	reqCost := int64(req.GetHitsAddend())
	if reqCost == 0 {
		reqCost = 1
	}
	ds := sc.ds
	replaced := map[string]bool{}
	entries := sc.entries[:0]
	defer func() { sc.entries = entries }() // keeps its buffer for the next request
	for i, d := range req.Descriptors {
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		entries, se, err := takeOwnEntries(entries)
		if err != nil {
			return nil, fmt.Errorf("descriptors[%d].%w", i, err)
		}
		ds[i] = descriptor{core: st.core, cost: reqCost, refund: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			ds[i].cost = clampCost(h.GetValue()) // the descriptor's wins; 0 checks without spending
		}
		var vars []rules.Entry
		if o := d.GetLimit(); o != nil && st.Rules.HasDomain(domain) && len(entries) > 0 {
			var ol *overrideLimit
			if ol, err = st.override(o, domain, entries); err != nil {
				return nil, fmt.Errorf("descriptors[%d].%w", i, err)
			}
			// Every entry names the budget, as envoyproxy/ratelimit keys an
			// override by the whole descriptor.
			ds[i].rule, ds[i].core, ds[i].override, vars = ol.rule, ol.core, true, entries
		} else {
			ds[i].rule, vars = st.Rules.AppendMatch(sc.vars, domain, entries)
			sc.vars = vars
		}
		if ds[i].rule == nil {
			continue
		}
		ds[i].priority, ds[i].unknownClass = classOf(ds[i].rule, se.priority)
		if ds[i].rule.InFlight {
			if vars, err = inFlight(st, &ds[i], d, domain, vars); err != nil {
				return nil, fmt.Errorf("descriptors[%d]: %w", i, err)
			}
		}
		if ds[i].rule.Settles || se.done && ds[i].override {
			prepareSettle(st, &ds[i], d, req.GetHitsAddend(), domain, entries, se)
		}
		sc.id = appendIdentity(sc.id[:0], vars)
		id := string(sc.id) // does not escape: on the stack when short
		ds[i].subject = st.Pseudonymizer.Pseudonym(SubjectKind, id, domain)
		ds[i].previous = st.Pseudonymizer.Previous(SubjectKind, id, domain)
		for _, name := range ds[i].rule.Replaces {
			replaced[name] = true
		}
	}
	for i := range ds {
		if r := ds[i].rule; r != nil && r.Name != "" && replaced[r.Name] {
			ds[i].rule, ds[i].replaced = nil, r
		}
	}
	return ds, nil
}

// groupDescriptors answers the descriptors that need no store (see
// answerLocally) and groups the rest into the Limiter.Checks that decide
// them: descriptors of one subject, cost, priority class and kind
// (refund or spend, shadow or enforced) share a check unless one policy would be in it
// twice; every refund has a check of its own. A group whose subject has
// a descriptor denied locally (a rule of 0 per unit) only peeks, so
// nothing is spent on it.
// The groups and statuses are sc's.
func groupDescriptors(ds []descriptor, sc *scratch) []*group {
	groups := sc.groups[:0]
	// groups keeps its buffer for the next request.
	defer func() { sc.groups = groups }()
	blocked := map[string]bool{} // subjects with a descriptor denied locally
	for i := range ds {
		d := &ds[i]
		r := d.rule
		if answerLocally(d, sc.rp) {
			if d.status.Code == rlspb.RateLimitResponse_OVER_LIMIT && !r.Shadow && !r.QuotaMode {
				blocked[d.subject] = true
			}
			continue
		}
		if d.refund && d.lease == "" {
			// Giving back more than the capacity is giving back the capacity;
			// giving back nothing is a check.
			d.cost = min(d.cost, evaluation.Defaults(r.Policy).MaxCost)
			d.refund = d.cost > 0
		}
		if d.dup = repeats(ds, i); d.dup > 0 {
			continue
		}
		var g *group
		for _, c := range groups {
			if c.core == d.core && c.subject == d.subject && c.cost == d.cost && c.refund == d.refund && c.shadow == r.Shadow && c.priority == d.priority && !d.refund && d.lease == "" && c.lease == "" && d.settle.op == 0 && c.settle.op == 0 && !r.QuotaMode && !c.quota && !c.has(ds, r.Policy.ID) {
				g = c
				break
			}
		}
		if g == nil {
			g = sc.newGroup()
			*g = group{core: d.core, subject: d.subject, previous: d.previous, cost: d.cost, refund: d.refund, lease: d.lease, release: d.release, settle: d.settle, quota: r.QuotaMode, shadow: r.Shadow, priority: d.priority, members: g.members[:0]}
			groups = append(groups, g)
		}
		g.members = append(g.members, i)
	}
	for _, g := range groups {
		g.peek = blocked[g.subject] && !g.shadow && !g.givesBack()
	}
	// Checks that spend nothing go first: a subject over its limit there
	// spends nothing in the groups after. quota_mode descriptors go last:
	// the others decide whether the request is over at all.
	slices.SortStableFunc(groups, func(a, b *group) int { return order(a) - order(b) })
	return groups
}

// repeats returns 1 + the index of the first descriptor before ds[i]
// that it repeats, decided by the store (same rule, subject, cost and
// kind), or 0.
func repeats(ds []descriptor, i int) int {
	d := &ds[i]
	for j := range ds[:i] {
		e := &ds[j]
		if e.dup == 0 && e.status == nil && e.rule != nil && e.rule.Policy.ID == d.rule.Policy.ID && e.core == d.core &&
			e.subject == d.subject && e.cost == d.cost && e.refund == d.refund && e.lease == d.lease && e.release == d.release && e.settle == d.settle && e.priority == d.priority {
			return j + 1
		}
	}
	return 0
}

// order ranks g among the groups of a request: checks, then spends, then
// the same for quota_mode groups.
func order(g *group) int {
	if g.quota {
		return 2 + spends(g)
	}
	return spends(g)
}

// spends is 1 for a group that spends (or refunds), 0 for a check.
func spends(g *group) int {
	if g.cost == 0 || g.peek {
		return 0
	}
	return 1
}

// answerLocally fills in d's status and reports true when d needs no
// store: OK when no rule matches, the rule is unlimited or d is a
// stream-done call that cannot settle, OVER_LIMIT when the rule allows 0
// per unit (it has no policy to ask). A cost is never judged here: the
// store judges every cost, as at every edge. The status is rp's.
func answerLocally(d *descriptor, rp *reply) bool {
	r := d.rule
	switch {
	case r == nil:
		d.status = &rp.status(rlspb.RateLimitResponse_OK, nil).status
	case r.Unlimited:
		sl := rp.status(rlspb.RateLimitResponse_OK, nil)
		sl.status.LimitRemaining = math.MaxUint32
		d.status = &sl.status
	case d.settle.idle():
		d.status = &rp.status(rlspb.RateLimitResponse_OK, r).status
	case !r.Decided():
		d.status = overLimit(r, rp)
	default:
		return false
	}
	return true
}

// overLimit is the status of a descriptor of r denied without the
// store's verdict: it can never be admitted. The status is rp's.
func overLimit(r *rules.Rule, rp *reply) *rlspb.RateLimitResponse_DescriptorStatus {
	sl := rp.status(rlspb.RateLimitResponse_OVER_LIMIT, r)
	sl.untilReset(r.Unit.Duration())
	return &sl.status
}

// response returns the answer to the decided descriptors ds, counting
// each in the metrics: their statuses, with shadow_mode rules' OVER_LIMIT
// answered OK, the overall code (OVER_LIMIT when a descriptor outside
// quota_mode is, or when every quota_mode descriptor is), and the
// response headers: rp's response.
func (s *Service) response(ds []descriptor, rp *reply) *rlspb.RateLimitResponse {
	resp := &rp.resp // its Statuses sized for ds
	resp.OverallCode = rlspb.RateLimitResponse_OK
	var quota, quotaOver int // quota_mode descriptors, and those over
	for i := range ds {
		d := &ds[i]
		if d.rule != nil && d.rule.Shadow && d.status.Code == rlspb.RateLimitResponse_OVER_LIMIT {
			// shadow_mode: decided and counted, never enforced.
			if s.metrics != nil {
				s.metrics.countDescriptor(d, "shadow_over_limit")
			}
			d.status.Code = rlspb.RateLimitResponse_OK
		} else if s.metrics != nil {
			s.metrics.countDescriptor(d, codeLabel(d))
		}
		over := d.status.Code == rlspb.RateLimitResponse_OVER_LIMIT
		switch {
		case d.rule != nil && d.rule.QuotaMode && !d.rule.Unlimited:
			quota++
			if over {
				quotaOver++
			}
		case over:
			resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = d.status
	}
	if quota > 0 && quotaOver == quota {
		resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT // every quota is spent
	}
	resp.ResponseHeadersToAdd = headers(ds, resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT, rp)
	return resp
}

// decide asks the store for one group and fills in its statuses. It
// returns a gRPC error when a fail-closed policy cannot be decided. The
// statuses are rp's.
func (s *Service) decide(ctx context.Context, ds []descriptor, g *group, rp *reply) error {
	if g.settle.op == sluice.Settle {
		return s.settle(ctx, ds, g, rp)
	}
	req := sluice.Request{Subject: g.subject, Previous: g.previous, Cost: g.cost}
	if !g.givesBack() {
		req.Priority = g.priority // what gives back takes no class
	}
	if len(g.members) == 1 {
		// One policy named as such: the shape a Limiter may answer from
		// a block of local quota (Policy.LocalQuota).
		req.Policy = ds[g.members[0]].rule.Policy.ID
	} else {
		req.Policies = make([]string, len(g.members))
		for j, i := range g.members {
			req.Policies[j] = ds[i].rule.Policy.ID
		}
	}
	switch {
	case g.release:
		req.Op, req.Cost, req.LeaseID = sluice.Release, 0, g.lease
	case g.peek, g.cost == 0:
		req.Op, req.Cost = sluice.Peek, 0
	case g.refund:
		req.Op = sluice.Refund
	case g.lease != "":
		req.Op, req.Cost, req.LeaseID = sluice.Acquire, 1, g.lease
	case g.settle.op == sluice.Estimate:
		req.Op, req.EvaluationID = sluice.Estimate, g.settle.id
	}
	a := g.core.DecideRequest(ctx, req, groupMode(ds, g))
	o := &a.Outcome
	switch {
	case edge.Rejected(o) && errors.Is(o.Err, algorithm.ErrCostTooHigh) && !g.givesBack():
		// More than the rule, a tenant plan's lower limit or the class's
		// share of either can ever admit: a denial, never an error Envoy's
		// failure_mode_deny: false admits.
		for _, i := range g.members {
			ds[i].status = overLimit(ds[i].rule, rp)
		}
		return nil
	case edge.Rejected(o):
		return status.Error(codes.InvalidArgument, "sluice: "+fmt.Sprint(o.Err))
	case a.Kind == edge.Admit || a.Kind == edge.Limit:
		for j, i := range g.members {
			d := &ds[i]
			d.verdict = o.Status // one policy named as such: the outcome's only status
			if req.Policy == "" {
				d.verdict = o.Statuses[j]
			}
			sst := &d.verdict
			code := rlspb.RateLimitResponse_OK
			if !sst.Allowed && !g.givesBack() {
				code = rlspb.RateLimitResponse_OVER_LIMIT
			}
			sl := rp.status(code, d.rule)
			sl.status.LimitRemaining = uint32(min(max(sst.Remaining, 0), math.MaxUint32))
			sl.untilReset(sst.ResetAfter)
			d.status, d.decided = &sl.status, sst
		}
		return nil
	}
	// The store could not decide: the failure mode answered.
	open := a.Kind == edge.FailOpen
	g.core.Log(ctx, slog.LevelWarn, "envoy rate limit: the store cannot decide", slog.String("outcome", o.Kind.String()), slog.Any("reason", o.Err), slog.Bool("fail_open", open))
	if !open {
		return errUnavailable(fmt.Sprint(o.Err))
	}
	for _, i := range g.members {
		ds[i].status = &rp.status(rlspb.RateLimitResponse_OK, ds[i].rule).status
		ds[i].decided = nil
		ds[i].failedOpen = true
	}
	return nil
}

// groupMode is the failure mode of g: open for a shadow group (a shadow
// rule never blocks) or when every rule of it fails open, else closed.
func groupMode(ds []descriptor, g *group) failure.Mode {
	if g.shadow {
		return failure.Open
	}
	for _, i := range g.members {
		if ds[i].rule.FailureMode != failure.Open {
			return failure.Closed
		}
	}
	return failure.Open
}

// identity frames the entries a rule does not fix, so that no two
// different lists give the same string.
func identity(vars []rules.Entry) string { return string(appendIdentity(nil, vars)) }

// appendIdentity appends the identity of vars to b.
func appendIdentity(b []byte, vars []rules.Entry) []byte {
	for _, e := range vars {
		b = strconv.AppendInt(b, int64(len(e.Key)), 10)
		b = append(b, ':')
		b = append(b, e.Key...)
		b = strconv.AppendInt(b, int64(len(e.Value)), 10)
		b = append(b, ':')
		b = append(b, e.Value...)
	}
	return b
}
