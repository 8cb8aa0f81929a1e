package sluice

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/overrideage"
	"github.com/sluicehq/sluice/internal/policyerr"
)

// Override gives one subject of one policy other numbers: a tenant's plan.
// The subject keeps its state (its key carries the policy's ID and
// Revision, which an override never changes), and the engine carries the
// state over to the new numbers: a subject that spent 80 of 100 and is
// raised to 1000 has 920 left; lowered to 50, it is denied until its
// state allows.
type Override struct {
	// Policy is the ID of the policy overridden. Example: "api".
	Policy string
	// Subject is the subject exactly as Requests carry it: at the server,
	// the pseudonym, so the raw subject is never stored.
	Subject string
	// Limit replaces the policy's Limit; 0 removes the override (in
	// Limiter.SetOverride and a Store's PutOverride). Example: 1000.
	Limit int64
	// Burst replaces the policy's Burst (token_bucket and gcra only).
	// Default: Limit.
	Burst int64
	// Window replaces the policy's Window (not for concurrency, which has
	// none). Default: the policy's Window.
	Window time.Duration
	// Note is what lists show in place of the subject. Example:
	// "acme: enterprise plan".
	Note string
}

// overrideStore is what a Store implements to keep overrides itself, so
// every Limiter on it applies them (redisstore keeps them in Redis,
// memstore in the process): these two methods. A Limiter whose store does
// not have them keeps the overrides set on it in its own memory.
type overrideStore interface {
	// PutOverride stores o, replacing the one for the same policy and
	// subject; an o with Limit 0 removes it.
	PutOverride(ctx context.Context, o Override) error
	// Overrides returns every stored override.
	Overrides(ctx context.Context) ([]Override, error)
}

// Override refresh timings: no decision is taken on overrides read from
// the store longer than overrideMaxAge ago (on the Limiter's clock,
// counted from when the read began): a Check that finds them older reads
// them first. A Check that finds them older than half that starts one
// background read, so a busy Limiter never waits for one. A read gives up
// after overrideReadTimeout.
const (
	overrideMaxAge      = 500 * time.Millisecond
	overrideReadTimeout = 2 * time.Second
)

// overrideKey names one override: policy ID and subject.
type overrideKey struct{ policy, subject string }

// overrideSet is an immutable snapshot of the overrides a Limiter
// applies.
type overrideSet struct {
	byKey map[overrideKey]*Policy // the overridden policies: same ID and Revision
	list  []Override
}

// overrides is a Limiter's override state.
type overrides struct {
	set     atomic.Pointer[overrideSet] // nil: no overrideStore and nothing set
	store   overrideStore               // nil when the Store is not one
	age     overrideage.Freshness       // how old the store's overrides are
	local   []Override                  // given in Options: applied under the store's
	mu      sync.Mutex                  // held to change stored and set
	stored  []Override                  // the store's, as last read (or the ones set here)
	changes int64                       // SetOverride calls: a read begun before one is stale
}

// initOverrides prepares l's overrides from opts and its store.
func (l *Limiter) initOverrides(opts Options) error {
	for i, o := range opts.Overrides {
		if o.Limit == 0 {
			return fmt.Errorf("sluice: New: overrides[%d]: limit = 0: must be at least 1", i)
		}
		if _, err := l.overridden(o); err != nil {
			return &prefixError{prefix: fmt.Sprintf("sluice: New: overrides[%d]: ", i), err: err}
		}
	}
	l.ovr.local = append([]Override(nil), opts.Overrides...)
	l.ovr.store, _ = l.store.(overrideStore)
	if l.ovr.store == nil && len(l.ovr.local) == 0 {
		return nil
	}
	l.ovr.set.Store(l.buildOverrides())
	if l.ovr.store != nil {
		// Read the store now, in the background (New does not wait on
		// the store): the first Check waits for that read, not longer.
		l.ovr.age.Init(l.clock, overrideMaxAge)
		l.readOverrides()
	}
	return nil
}

// overridden returns p, the policy o names, with o's numbers, validated
// by Policy.Validate's rules; nil for an o with Limit 0.
func (l *Limiter) overridden(o Override) (*Policy, error) {
	base := l.policy(o.Policy)
	if base == nil {
		return nil, l.unknown("policy", o.Policy)
	}
	if o.Limit == 0 {
		return nil, nil
	}
	if err := checkSubject(o.Subject); err != nil {
		return nil, err
	}
	q := *base
	q.Limit, q.Burst = o.Limit, o.Burst
	if base.Algorithm == Concurrency {
		if o.Burst != 0 {
			return nil, &policyerr.Error{Policy: q.ID, Field: "burst", Value: fmt.Sprint(o.Burst), Rule: "does not apply to concurrency: an override sets only its limit"}
		}
		if o.Window != 0 {
			return nil, &policyerr.Error{Policy: q.ID, Field: "window", Value: o.Window.String(), Rule: "does not apply to concurrency, which has no window"}
		}
	} else if o.Window != 0 {
		q.Window = o.Window
	}
	baseCap := base.params().Capacity(algorithm.Kind(base.Algorithm))
	q.MaxCost = 0 // the new maximum, unless the policy asked for less
	if base.MaxCost < baseCap {
		q.MaxCost = base.MaxCost
	}
	local := q.LocalQuota.Enabled
	q.LocalQuota = LocalQuota{}
	q = q.withDefaults()
	if c := q.params().Capacity(algorithm.Kind(q.Algorithm)); q.MaxCost > c {
		q.MaxCost = c
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if local { // local quota's defaults for the subject's own numbers, unless they are too small for blocks
		lq := q
		lq.LocalQuota = LocalQuota{Enabled: true}
		if lq = lq.withDefaults(); lq.validateLocalQuota(func(_, _, _ string) error { return errTooSmall }) == nil {
			q = lq
		}
	}
	return &q, nil
}

// errTooSmall marks numbers too small for local quota's blocks.
var errTooSmall = errors.New("too small for blocks")

// buildOverrides returns a snapshot of l's local overrides under the
// stored ones (a stored override of the same policy and subject wins).
// l.ovr.mu is held, or l is not yet shared.
func (l *Limiter) buildOverrides() *overrideSet {
	stored := l.ovr.stored
	s := &overrideSet{byKey: make(map[overrideKey]*Policy, len(l.ovr.local)+len(stored))}
	add := func(o Override) {
		if p, err := l.overridden(o); err == nil && p != nil {
			k := overrideKey{o.Policy, o.Subject}
			if _, dup := s.byKey[k]; !dup {
				s.list = append(s.list, o)
			} else {
				for i := range s.list {
					if s.list[i].Policy == o.Policy && s.list[i].Subject == o.Subject {
						s.list[i] = o
					}
				}
			}
			s.byKey[k] = p
		}
	}
	for _, o := range l.ovr.local {
		add(o)
	}
	for _, o := range stored {
		add(o) // an override the store holds for a policy l lacks is skipped
	}
	sort.Slice(s.list, func(i, j int) bool {
		a, b := s.list[i], s.list[j]
		return a.Policy < b.Policy || a.Policy == b.Policy && a.Subject < b.Subject
	})
	return s
}

// applyOverrides is the overrides stage, the first: it gives each policy
// of d.ev the subject's own numbers where an override names them. Over a
// store that keeps overrides, overrides read too long ago are read again
// first (overrideMaxAge; see awaitOverrides for how long a Check waits).
func (l *Limiter) applyOverrides(ctx context.Context, d *decision, next step) {
	if l.ovr.store != nil {
		switch l.ovr.age.State() {
		case overrideage.Old:
			l.readOverrides()
		case overrideage.Stale:
			l.awaitOverrides(ctx, l.readOverrides())
		}
	}
	if s := l.ovr.set.Load(); s != nil {
		ev := &d.ev
		for i, p := range ev.Policies {
			ev.Policies[i] = l.override(s, p, ev.Subject, ev.Previous)
		}
	}
	next(ctx, d)
}

// awaitOverrides waits for the overrides read of ch to end, for at most
// half the time ctx has left (on the Limiter's clock): a store that slow
// to give its overrides is most likely failing, and the decision, sent to
// it with the other half, says how (and feeds its breaker) where a Check
// that spent its whole deadline waiting here would say nothing of the
// store. Such a decision goes on the overrides in hand.
func (l *Limiter) awaitOverrides(ctx context.Context, ch <-chan struct{}) {
	if dl, ok := ctx.Deadline(); ok {
		now := l.clock.Now()
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, now.Add(dl.Sub(now)/2))
		defer cancel()
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// override returns the policy to decide p by for subject: p, or its
// override in s, l's snapshot; failing one for subject, the one of the
// first of previous (its pseudonyms under older keys) that has one, so a
// key rotation keeps a tenant's plan as it keeps the tenant's state.
func (l *Limiter) override(s *overrideSet, p *Policy, subject string, previous []string) *Policy {
	if len(s.byKey) == 0 {
		return p
	}
	if q := s.byKey[overrideKey{p.ID, subject}]; q != nil {
		return q
	}
	for _, old := range previous {
		if q := s.byKey[overrideKey{p.ID, old}]; q != nil {
			return q
		}
	}
	return p
}

// readOverrides starts one read of the store's overrides, unless one is
// under way, and returns a channel closed when the read under way ends.
func (l *Limiter) readOverrides() <-chan struct{} {
	ch, start := l.ovr.age.Begin()
	if !start {
		return ch
	}
	go func() {
		began := l.clock.Now()
		l.ovr.mu.Lock()
		changes := l.ovr.changes
		l.ovr.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), overrideReadTimeout)
		list, err := l.ovr.store.Overrides(ctx)
		cancel()
		fresh := err == nil && l.storeOverrides(list, changes)
		l.ovr.age.End(ch, fresh, began, l.clock.Now())
	}()
	return ch
}

// storeOverrides makes list, read from the store after changes calls of
// SetOverride, the stored overrides l applies, building a new snapshot
// only when they changed, and reports whether l applies them; a read that
// a later SetOverride overtook is dropped.
func (l *Limiter) storeOverrides(list []Override, changes int64) bool {
	l.ovr.mu.Lock()
	defer l.ovr.mu.Unlock()
	if changes != l.ovr.changes {
		return false
	}
	if !equalOverrides(list, l.ovr.stored) {
		l.ovr.stored = append([]Override(nil), list...)
		l.ovr.set.Store(l.buildOverrides())
	}
	return true
}

func equalOverrides(a, b []Override) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// SetOverride gives o.Subject of policy o.Policy o's numbers, or with
// o.Limit 0 removes its override. The numbers obey Policy.Validate's
// rules for the policy's algorithm; a concurrency policy takes a limit
// only. With a Store that keeps overrides (one with the methods
// PutOverride(ctx, Override) error and Overrides(ctx) ([]Override,
// error), as memstore and redisstore have), the override is stored there
// and every Limiter on it applies it to every decision taken 500ms or
// more after (each reads the store's overrides again before deciding on
// ones read longer ago than that); otherwise it lives in l. l applies it
// at once.
func (l *Limiter) SetOverride(ctx context.Context, o Override) error {
	if o.Limit < 0 {
		return &policyerr.Error{Policy: o.Policy, Field: "limit", Value: fmt.Sprint(o.Limit), Rule: "must be at least 1, or 0 to remove the override"}
	}
	if _, err := l.overridden(o); err != nil {
		return err
	}
	if o.Limit == 0 {
		if err := checkSubject(o.Subject); err != nil {
			return err
		}
		o = Override{Policy: o.Policy, Subject: o.Subject}
	}
	l.ovr.mu.Lock()
	defer l.ovr.mu.Unlock()
	if l.ovr.store != nil {
		if err := l.ovr.store.PutOverride(ctx, o); err != nil {
			return fmt.Errorf("sluice: SetOverride: %w", err)
		}
	}
	next := make([]Override, 0, len(l.ovr.stored)+1)
	for _, s := range l.ovr.stored {
		if s.Policy != o.Policy || s.Subject != o.Subject {
			next = append(next, s)
		}
	}
	if o.Limit != 0 {
		next = append(next, o)
	}
	l.ovr.stored = next
	l.ovr.changes++
	l.ovr.set.Store(l.buildOverrides())
	return nil
}

// Overrides returns the overrides l applies (those of Options and, with
// a Store that keeps overrides, the ones stored there, read now), by
// policy then subject.
func (l *Limiter) Overrides(ctx context.Context) ([]Override, error) {
	if l.ovr.store != nil {
		l.ovr.mu.Lock()
		changes := l.ovr.changes
		l.ovr.mu.Unlock()
		list, err := l.ovr.store.Overrides(ctx)
		if err != nil {
			return nil, fmt.Errorf("sluice: Overrides: %w", err)
		}
		l.storeOverrides(list, changes)
	}
	s := l.ovr.set.Load()
	if s == nil {
		return nil, nil
	}
	return append([]Override(nil), s.list...), nil
}
