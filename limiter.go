package sluice

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/form"
	"github.com/sluicehq/sluice/internal/overridemap"
	"github.com/sluicehq/sluice/internal/policyerr"
	"go.opentelemetry.io/otel/trace"
)

// Request asks for one operation (Op) on one or more policies for one
// subject: by default, whether Subject may spend Cost units.
type Request struct {
	// Op is what the request does. Default: Spend.
	Op Op
	// Policy is the ID of the policy to check. Exactly one of Policy and
	// Policies is set.
	Policy string
	// Policies are the IDs of several policies to check at once, all or
	// nothing.
	Policies []string
	// Subject is whose budget is spent: a pseudonym (see package subject),
	// never a raw personal identifier. 1 to 200 bytes of printable ASCII
	// other than space, '{' and '}'.
	Subject string
	// Cost is the number of units to spend (Spend, Acquire, Estimate) or
	// give back (Refund); the zero value means 1. A Settle's is the actual
	// cost, 0 included. Every other operation takes none: leave it 0. A
	// negative cost is Incompatible.
	Cost int64
	// LeaseID names the lease a Release gives back or a Renew extends
	// (Outcome.Lease.ID), or the one an Acquire takes when the caller
	// picks it; at most 64 bytes of A-Z a-z 0-9 - _.
	LeaseID string
	// Previous are the pseudonyms the same caller had under older keys
	// while a key rotation is under way, newest first (see
	// subject.Pseudonymizer.Previous; httplimit and the server pass them).
	// A policy with no state under Subject takes the state found under
	// the first of them that has one: it is carried over, kept under
	// Subject from then on, so adding a key resets no budget. The older
	// state is left to expire. A Reset clears the state under every one of
	// them too. At most 4, each a valid Subject other than Subject.
	Previous []string
	// EvaluationID, when set, identifies this request across retries: a
	// retry after an Indeterminate outcome with the same id gets the first
	// decision back (Outcome.Replayed) instead of spending twice, within
	// the policy's DedupeTTL. 1 to 128 bytes of printable ASCII other than
	// space. A Peek's is ignored; Reset, Release and Renew take none.
	EvaluationID string
	// Priority is the request's priority class, one the policies declare
	// (Policy.Priorities), e.g. "sheddable": the request may use only that
	// class's share of each policy's capacity, on the same budget as every
	// other class. It applies to what asks for admission (Spend, Peek,
	// Acquire, Renew, Estimate, Book) and is ignored by what gives back or clears.
	// A class no policy of the Limiter declares is Incompatible. A request
	// of a class with less than the whole capacity bypasses the near cache
	// and local quota. Default: "" (the class "default").
	Priority string
	// MaxWait is a Book's bound (Limiter.Wait, Limiter.Reserve): the
	// longest it may wait for its slot, when less than the policy's
	// MaxWait; more is held to the policy's (a caller may ask for less,
	// never more). Past it the request is Denied and books nothing. A
	// whole number of µs, at most 24h. Every other operation takes none.
	// Default: 0, the policy's.
	MaxWait time.Duration
}

// Options configure a Limiter. The zero value means the defaults.
type Options struct {
	// TracerProvider, when set, records every decision Check asks of the
	// store through the OpenTelemetry API, under the scope
	// "github.com/sluicehq/sluice" (see the README's "Tracing"): its
	// policies, their algorithms, the operation, the outcome (and its
	// cause), the store, how long the store took and, where the store
	// batches, how many decisions shared its round trip. Never a subject,
	// pseudonym, lease or evaluation id. A request answered without the
	// store (malformed, past its deadline, a near-cache denial) is not
	// recorded. Default: nil, nothing recorded, at no cost.
	TracerProvider trace.TracerProvider
	// Overrides are subjects' numbers applied from the start (a config
	// file's), each valid as Limiter.SetOverride demands with a Limit of
	// at least 1. They live in the Limiter only; one set with SetOverride
	// or kept by the Store for the same policy and subject wins over them.
	// Default: none.
	Overrides []Override
	// OnLocalQuota, when set, is told what local quota
	// (Policy.LocalQuota) did for a policy, as deltas: requests admitted
	// from blocks without a store call, blocks taken (one store call
	// each) and the units they took, and units of blocks whose time ran
	// out before they were admitted (spent in the store, admitted to
	// nobody: counted when the Limiter next sees the subject or forgets
	// it). Called from Check's goroutines, concurrently: it must be
	// quick and safe for concurrent use. The server's metrics
	// (sluice_local_*) are these sums. Default: nil, nothing told.
	OnLocalQuota func(policy string, local, blocks, units, unused int64)
	// Clock is the Limiter's one clock, handed to every stage of Check:
	// it tells whether a context's deadline has passed, how long a
	// near-cache denial and a block of local quota live, how old the
	// overrides read from the store are, and how long the store took (in
	// a trace). It must not run faster than the store's clock; a test
	// that gives the store a fake clock gives the Limiter the same.
	// Default: the real clock.
	Clock Clock
}

// Limiter checks requests against a fixed set of policies on one Store,
// with the subjects' overrides (see SetOverride). Safe for concurrent
// use; it needs no cleanup (close the Store). Over a Store that keeps
// overrides, no decision is taken on overrides read longer ago than a
// bound; a Check that finds them half that old starts one short
// background read, bounded by a timeout: nothing else runs in the
// background.
type Limiter struct {
	store    Store
	clock    Clock
	policies map[string]*Policy
	list     []*Policy                             // the policies in order, looked through instead of policies when few
	ids      []string                              // their IDs
	pool     sync.Pool                             // *decision
	run      step                                  // the stages of Check, then the store: see stage.go
	near     *nearCache                            // nil when no policy has NearCache
	ovr      *overridemap.State[Override, *Policy] // subjects' other numbers: see overrides.go
	ovrStore overrideStore                         // the Store, when it keeps overrides
	classes  []string                              // the priority classes the policies declare, sorted
}

// New returns a Limiter over store for policies: at least one, each valid,
// with distinct IDs.
func New(store Store, policies []Policy, opts Options) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("sluice: New: store is nil")
	}
	if len(policies) == 0 {
		return nil, errors.New("sluice: New: no policies: at least one is required")
	}
	l := &Limiter{store: store, clock: opts.Clock, policies: make(map[string]*Policy, len(policies))}
	if l.clock == nil {
		// The monotonic clock: half time.Now's cost, and never stepped.
		l.clock = clock.NewMonotonic()
	}
	for i, p := range policies {
		if err := p.Validate(); err != nil {
			return nil, &policyerr.Prefixed{Prefix: fmt.Sprintf("sluice: New: policies[%d]: ", i), Err: err}
		}
		if _, dup := l.policies[p.ID]; dup {
			return nil, fmt.Errorf("sluice: New: policies[%d]: id %q is used twice", i, p.ID)
		}
		p = p.withDefaults()
		p.Priorities = maps.Clone(p.Priorities) // the Limiter's own: a caller's later change is not seen unvalidated
		for c := range p.Priorities {
			if !slices.Contains(l.classes, c) {
				l.classes = append(l.classes, c)
			}
		}
		l.policies[p.ID] = &p
		l.list, l.ids = append(l.list, &p), append(l.ids, p.ID)
	}
	slices.Sort(l.classes)
	l.pool.New = func() any { return new(decision) }
	if err := l.initOverrides(opts); err != nil {
		return nil, err
	}
	l.run = chain(l.stages(opts), l.evaluate)
	return l, nil
}

// stages returns the stages of l's Check, in order: the subjects' own
// numbers first, then what may answer without the store, then tracing
// around the store itself. A stage no policy asks for is left out.
func (l *Limiter) stages(opts Options) []stage {
	s := []stage{l.applyOverrides}
	for _, p := range l.list {
		if p.NearCache {
			l.near = newNearCache(l.clock)
			s = append(s, l.near.do)
			break
		}
	}
	for _, p := range l.list {
		if p.LocalQuota.Enabled {
			s = append(s, newLocalQuota(l.clock, opts.OnLocalQuota).do)
			break
		}
	}
	if opts.TracerProvider != nil {
		s = append(s, newTracer(opts.TracerProvider, l.store, l.clock).do)
	}
	return s
}

// Policy returns the validated policy with the given ID, defaults applied.
func (l *Limiter) Policy(id string) (Policy, bool) {
	p := l.policy(id)
	if p == nil {
		return Policy{}, false
	}
	return *p, true
}

// maxScan is the most policies l.policy compares one by one rather than
// hash the id for the map: comparing a few IDs, most of them rejected on
// their length, costs less than hashing one.
const maxScan = 8

// policy returns l's policy id, or nil.
func (l *Limiter) policy(id string) *Policy {
	if len(l.list) <= maxScan {
		for _, p := range l.list {
			if p.ID == id {
				return p
			}
		}
		return nil
	}
	return l.policies[id]
}

// Policies returns the IDs of l's policies in the order given to New.
func (l *Limiter) Policies() []string { return slices.Clone(l.ids) }

// Check takes req. It does not panic itself and never returns an error:
// every failure is an Outcome of kind Incompatible, Unavailable or
// Indeterminate with Err set. A request that is malformed, names a policy l
// does not have, or comes after its context's deadline is answered without
// touching the store; the store checks the operation's own rules.
func (l *Limiter) Check(ctx context.Context, req Request) Outcome {
	// One pipeline: validate req into an Evaluation, run l's stages over
	// it (stage.go), the store last, and map its answer in outcomeOf.
	if req.Op == Release && req.LeaseID == "" && req.Subject == "" && req.Policy == "" && len(req.Policies) == 0 {
		return Outcome{Kind: Allowed} // the zero Lease's: nothing held (see Release)
	}
	if err := ctx.Err(); err != nil {
		return Outcome{Kind: Unavailable, Cause: DeadlinePassed, Err: fmt.Errorf("sluice: nothing sent: %w", err)}
	}
	if d, ok := ctx.Deadline(); ok && !l.clock.Now().Before(d) {
		return Outcome{Kind: Unavailable, Cause: DeadlinePassed, Err: fmt.Errorf("sluice: nothing sent: %w", context.DeadlineExceeded)}
	}
	d := l.pool.Get().(*decision)
	if err := l.validate(&d.ev, &req); err != nil {
		l.put(d)
		return Outcome{Kind: Incompatible, Err: err}
	}
	d.many = len(req.Policies) > 0
	l.run(ctx, d)
	o := d.o
	l.put(d)
	return o
}

// validate puts req, validated, into ev, and records its form there.
func (l *Limiter) validate(ev *Evaluation, req *Request) error {
	if err := l.prepare(ev, req); err != nil {
		return err
	}
	ev.short = shortForm(ev)
	return nil
}

// shortForm is the one predicate of the short form, the common decision
// every store may take by a course of its own (short.go, short.lua): one
// policy, no evaluation id (nothing to remember or replay), no older
// subject (nothing to carry over), no book (nothing booked ahead); on a
// rate policy a spend of at least one unit or a peek, with no lease; on a
// concurrency policy an acquire or a release of one lease. Every store
// honours it: the decision reads and writes one key, so a short course
// needs no record, no carry and no second state, and whatever the
// Limiter's stages do after validation keeps it (an override swaps in a
// policy of the same algorithm; local quota makes a spend a held spend of
// more units, which a short course checks as the general one does). A
// priority class is short too: its reserve is one number of the policy.
// Whatever else an operation's rules forbid (a cost above MaxCost, a held
// spend's bounds, a lease's form) is left to the store's check, as on the
// general course. The field it sets is read below through
// evaluation.Short, and nowhere decided again.
func shortForm(ev *Evaluation) bool {
	if len(ev.Policies) != 1 || ev.EvaluationID != "" || len(ev.Previous) != 0 || ev.MaxWait != 0 {
		return false
	}
	if ev.Policies[0].Algorithm == Concurrency {
		return ev.Op == Acquire || ev.Op == Release
	}
	return ev.LeaseID == "" && (ev.Op == Spend && ev.Cost >= 1 || ev.Op == Peek && ev.Cost == 0)
}

func init() {
	// The stores read the form through package form (see there), and the
	// Envoy service the choice of the most restrictive status.
	form.Short = func(ev any) bool { return ev.(*Evaluation).short }
	form.Record = func(ev any) { e := ev.(*Evaluation); e.short = shortForm(e) }
	form.MostRestrictive = func(ss any) int { return mostRestrictive(ss.([]Status)) }
}

// put returns d to l's pool, emptied.
func (l *Limiter) put(d *decision) {
	ev := &d.ev
	clear(ev.Policies)
	*d = decision{ev: Evaluation{Policies: ev.Policies[:0], Statuses: ev.Statuses[:0]}}
	l.pool.Put(d)
}

// prepare validates what only l knows of req (its policies, by
// policiesOf's rules, and the form of what req carries) into ev.
func (l *Limiter) prepare(ev *Evaluation, req *Request) error {
	var err error
	if ev.Policies, err = policiesOf(ev.Policies, req.Policy, req.Policies, l.policy, l.ids); err != nil {
		return err
	}
	if err := checkSubject(req.Subject); err != nil {
		return err
	}
	if err := checkCarried(req.Subject, req.Previous, req.EvaluationID, req.LeaseID); err != nil {
		return err
	}
	if req.Priority != "" && !l.knows(req.Priority) {
		return algorithm.UnknownClass(req.Priority, l.classes)
	}
	ev.Priority = req.Priority
	cost := req.Cost
	if cost == 0 && (req.Op == Spend || req.Op == Refund || req.Op == Acquire || req.Op == Estimate || req.Op == Book) {
		cost = 1
	}
	if err := bookBound(ev, req); err != nil {
		return err
	}
	ev.Op, ev.Subject, ev.Cost, ev.LeaseID, ev.EvaluationID = req.Op, req.Subject, cost, req.LeaseID, req.EvaluationID
	ev.Previous = req.Previous
	if ev.Op == Acquire && ev.LeaseID == "" {
		ev.LeaseID = newLeaseID(ev.Subject, ev.EvaluationID)
	}
	return nil
}

// knows reports whether class is a priority class a request may name:
// one a policy declares, or "default".
func (l *Limiter) knows(class string) bool {
	return class == algorithm.DefaultClass || slices.Contains(l.classes, class)
}

// unknown is the error for a policy id l does not have, naming the ones
// it has (the first few).
func (l *Limiter) unknown(field, id string) error { return unknownPolicy(field, id, l.ids) }
