package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/engine/algorithm"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

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

// ShouldRateLimit decides req with the State it starts with (see the
// package documentation), one phase a file: match.go reads and matches
// its descriptors, decideGroups asks the edge core once per group, and
// answer.go builds the answer and counts it.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	st := s.state.Load()
	sc := getScratch()
	defer sc.release()
	err := st.match(req, sc)
	if err == nil {
		err = s.decideGroups(ctx, sc)
	}
	return s.answer(ctx, st, req, sc.ds, err)
}

// The memory of one request. BenchmarkShouldRateLimit's memory profile
// counted some twenty allocations of the service's own per call, each a
// small object the collector then traced: the descriptors, groups and
// buffers of matching, which live only while the request is decided,
// come from a pool (scratch), touched when a request starts and when it
// is answered; the answer and the messages it points to, which gRPC
// marshals after the handler returns and so are never pooled, are
// allocated together (answer.go's reply). Without the pool a decision
// made 9 allocations more (185 for 176 a call in the benchmark).

// scratch is what one request works in, taken from scratchPool and given
// back, cleared, when the request is answered. Nothing in it outlives
// the request: the answer points into its reply, never into scratch.
type scratch struct {
	ds      []descriptor
	groups  []*group
	gbuf    []group // the groups' storage, at most one per descriptor
	entries []rules.Entry
	vars    []rules.Entry
	id      []byte // a descriptor's identity, framed
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Bounds of what a scratch keeps between requests: one that served a
// larger request (MaxDescriptors or MaxEntries raised, long values) is
// left to the collector rather than kept at that size.
const (
	keepDescriptors = DefaultMaxDescriptors
	keepEntries     = DefaultMaxEntries
	keepIdentity    = 4 << 10
)

// getScratch returns a cleared scratch; match sizes its descriptors.
func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// release gives sc back to the pool, cleared, unless it grew past the
// bounds.
func (sc *scratch) release() {
	if sc.reset() {
		scratchPool.Put(sc)
	}
}

// reset clears sc, so that no request sees another's descriptors and the
// collector is not kept from what they pointed to, and reports whether
// sc is within the bounds of what the pool keeps.
func (sc *scratch) reset() bool {
	clear(sc.ds)
	for i := range sc.gbuf {
		sc.gbuf[i] = group{members: sc.gbuf[i].members[:0]}
	}
	clear(sc.groups)
	clear(sc.entries[:cap(sc.entries)])
	clear(sc.vars[:cap(sc.vars)])
	sc.ds, sc.groups, sc.gbuf = sc.ds[:0], sc.groups[:0], sc.gbuf[:0]
	sc.entries, sc.vars, sc.id = sc.entries[:0], sc.vars[:0], sc.id[:0]
	return cap(sc.ds) <= keepDescriptors && cap(sc.entries) <= keepEntries && cap(sc.vars) <= keepEntries && cap(sc.id) <= keepIdentity
}

// group is the descriptors decided in one request to the edge core.
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
	settle   settleCall // a settling rule's estimate or settle
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

// givesBack reports whether g gives back what was spent (a refund, a
// lease's release or a settle): it is never only checked, and never a
// denial.
func (g *group) givesBack() bool { return g.refund || g.release || g.settle.op == sluice.Settle }

// joins reports whether d (of rule r) is decided in g's request: one
// subject, cost, priority class and kind (shadow or enforced), and never
// what has a request of its own (a refund, a lease, a settle, a
// quota_mode descriptor) or a policy g already has.
func (g *group) joins(ds []descriptor, d *descriptor) bool {
	r := d.rule
	switch {
	case g.core != d.core, g.subject != d.subject, g.cost != d.cost, g.shadow != r.Shadow, g.priority != d.priority:
		return false
	case g.refund, d.refund, g.lease != "", d.lease != "", g.settle.op != 0, d.settle.op != 0, g.quota, r.QuotaMode:
		return false
	}
	return !g.has(ds, r.Policy.ID)
}

// newGroup returns a cleared group from sc's storage (one of its own
// when the storage is used up), its members' buffer kept.
func (sc *scratch) newGroup() *group {
	if len(sc.gbuf) == cap(sc.gbuf) {
		return new(group)
	}
	sc.gbuf = sc.gbuf[:len(sc.gbuf)+1]
	return &sc.gbuf[len(sc.gbuf)-1]
}

// errUnavailable is the answer when the store cannot decide for a
// fail-closed policy.
func errUnavailable(reason string) error {
	return status.Error(codes.Unavailable, "sluice: the store cannot decide and the policy fails closed: "+reason)
}

// decideGroups asks the edge core for every group of sc's descriptors,
// in order. Once a subject is denied, its later groups only check
// (nothing more is spent); once any enforced descriptor that is not in
// quota_mode is over, the request is over whatever its quota_mode
// descriptors say, so they (decided last) only check too. A quota_mode
// descriptor over its limit stops nothing.
func (s *Service) decideGroups(ctx context.Context, sc *scratch) error {
	ds := sc.ds
	groups := groupDescriptors(ds, sc)
	var denied map[string]bool // subjects with a group the store denied; made at the first
	over := false              // an enforced descriptor outside quota_mode is over
	for i := range ds {
		if d := &ds[i]; d.code != rlspb.RateLimitResponse_UNKNOWN && d.rule != nil && !d.rule.Shadow && !d.rule.QuotaMode {
			over = over || d.code == rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	for _, g := range groups {
		if (denied[g.subject] || g.quota && over) && !g.shadow && !g.givesBack() {
			g.peek = true // nothing more is spent once denied
		}
		if err := decide(ctx, ds, g); err != nil {
			return err
		}
		if g.quota || g.shadow || g.givesBack() {
			continue
		}
		for _, i := range g.members {
			if ds[i].code == rlspb.RateLimitResponse_OVER_LIMIT {
				if denied == nil {
					denied = map[string]bool{}
				}
				denied[g.subject], over = true, true
			}
		}
	}
	return nil
}

// groupDescriptors answers the descriptors that need no store (see
// answerLocally) and groups the rest into the requests to the edge core
// that decide them (group.joins); every refund has a request of its own.
// A group whose subject has a descriptor denied locally (a rule of 0 per
// unit) only peeks, so nothing is spent on it. The groups are sc's.
func groupDescriptors(ds []descriptor, sc *scratch) []*group {
	if cap(sc.gbuf) < len(ds) {
		sc.gbuf = make([]group, 0, len(ds))
	}
	groups := sc.groups[:0]
	// groups keeps its buffer for the next request.
	defer func() { sc.groups = groups }()
	var blocked map[string]bool // subjects with a descriptor denied locally; made at the first
	for i := range ds {
		d := &ds[i]
		r := d.rule
		if answerLocally(d) {
			if d.code == rlspb.RateLimitResponse_OVER_LIMIT && !r.Shadow && !r.QuotaMode {
				if blocked == nil {
					blocked = map[string]bool{}
				}
				blocked[d.subject] = true
			}
			continue
		}
		if d.refund && d.lease == "" {
			// Giving back more than the capacity is giving back the capacity;
			// giving back nothing is a check.
			d.cost = min(d.cost, r.MaxCost)
			d.refund = d.cost > 0
		}
		if d.dup = repeats(ds, i); d.dup > 0 {
			continue
		}
		var g *group
		for _, c := range groups {
			if c.joins(ds, d) {
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
		if e.dup == 0 && e.code == rlspb.RateLimitResponse_UNKNOWN && e.rule != nil && e.rule.Policy.ID == d.rule.Policy.ID && e.core == d.core &&
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

// answerLocally decides d and reports true when it needs no store: OK
// when no rule matches, the rule is unlimited or d is a stream-done call
// that cannot settle, OVER_LIMIT when the rule allows 0 per unit (it has
// no policy to ask). A cost is never judged here: the store judges every
// cost, as at every edge.
func answerLocally(d *descriptor) bool {
	r := d.rule
	switch {
	case r == nil, d.settle.done && d.settle.op == 0:
		d.code = rlspb.RateLimitResponse_OK
	case r.Unlimited:
		d.code, d.remaining = rlspb.RateLimitResponse_OK, math.MaxUint32
	case r.Policy.ID == "": // the store does not decide it (Rule.Decided): 0 per unit
		d.deny()
	default:
		return false
	}
	return true
}

// deny decides d OVER_LIMIT without the store's verdict: it can never be
// admitted, and its window is one unit of its rule.
func (d *descriptor) deny() {
	d.code, d.reset, d.timed = rlspb.RateLimitResponse_OVER_LIMIT, d.rule.UnitLength, true
}

// decide asks the edge core for one group, in one request, and decides
// its members. It returns a gRPC error when a fail-closed policy cannot
// be decided.
func decide(ctx context.Context, ds []descriptor, g *group) error {
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
	mode := groupMode(ds, g)
	switch {
	case g.settle.op == sluice.Settle:
		req.Op, req.EvaluationID, mode = sluice.Settle, g.settle.id, failure.Open
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
	a := g.core.DecideRequest(ctx, req, mode)
	o := &a.Outcome
	switch {
	case req.Op == sluice.Settle:
		settled(ds, g, o)
		return nil
	case a.Kind == edge.Admit || a.Kind == edge.Limit:
		for j, i := range g.members {
			d := &ds[i]
			d.verdict = o.Status // one policy named as such: the outcome's only status
			if req.Policy == "" {
				d.verdict = o.Statuses[j]
			}
			d.code = rlspb.RateLimitResponse_OK
			if !d.verdict.Allowed && !g.givesBack() {
				d.code = rlspb.RateLimitResponse_OVER_LIMIT
			}
			d.remaining = uint32(min(max(d.verdict.Remaining, 0), math.MaxUint32))
			d.reset, d.timed, d.decided = d.verdict.ResetAfter, true, &d.verdict
		}
		return nil
	case edge.Rejected(o) && errors.Is(o.Err, algorithm.ErrCostTooHigh) && !g.givesBack():
		// More than the rule, a tenant plan's lower limit or the class's
		// share of either can ever admit: a denial, never an error Envoy's
		// failure_mode_deny: false admits.
		for _, i := range g.members {
			ds[i].deny()
		}
		return nil
	case edge.Rejected(o):
		return status.Error(codes.InvalidArgument, "sluice: "+fmt.Sprint(o.Err))
	}
	// The store could not decide: the failure mode answered.
	open := a.Kind == edge.FailOpen
	g.core.Log(ctx, slog.LevelWarn, "envoy rate limit: the store cannot decide", slog.String("outcome", o.Kind.String()), slog.Any("reason", o.Err), slog.Bool("fail_open", open))
	if !open {
		return errUnavailable(fmt.Sprint(o.Err))
	}
	for _, i := range g.members {
		ds[i].code, ds[i].decided, ds[i].failedOpen = rlspb.RateLimitResponse_OK, nil, true
	}
	return nil
}

// settled decides the members of g, a settle (the estimate replaced by
// g.cost), by o: always OK (a settle is never denied); one the store
// could not take is given its reason (match.go's settle comment). The
// edge core counts it (sluice_settled_units_total).
func settled(ds []descriptor, g *group, o *sluice.Outcome) {
	for _, i := range g.members {
		d := &ds[i]
		d.code = rlspb.RateLimitResponse_OK
		switch {
		case o.Kind == sluice.Allowed:
			d.remaining = uint32(min(max(o.Remaining, 0), math.MaxUint32))
			d.reset, d.timed = o.ResetAfter, true
		case o.Kind == sluice.Incompatible && errors.Is(o.Err, sluice.ErrInvalidRequest):
			d.settle.why = noEstimate
		default:
			d.settle.why = storeUnavailable
		}
	}
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
