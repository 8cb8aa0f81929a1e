package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/overridemap"
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
// memstore in the process): PutOverride stores o in place of the one for
// the same policy and subject (Limit 0 removes it), Overrides returns
// every stored one. A Limiter whose store does not have them keeps the
// overrides set on it in its own memory.
type overrideStore interface {
	PutOverride(ctx context.Context, o Override) error
	Overrides(ctx context.Context) ([]Override, error)
}

// initOverrides prepares l's overrides from opts and its store
// (internal/overridemap keeps them and reads the store's).
func (l *Limiter) initOverrides(opts Options) error {
	ps := make([]*Policy, len(opts.Overrides))
	for i, o := range opts.Overrides {
		if o.Limit == 0 {
			return fmt.Errorf("sluice: New: overrides[%d]: limit = 0: must be at least 1", i)
		}
		var err error
		if ps[i], err = l.overridden(o); err != nil {
			return &policyerr.Prefixed{Prefix: fmt.Sprintf("sluice: New: overrides[%d]: ", i), Err: err}
		}
	}
	cfg := overridemap.Config[Override, *Policy]{
		Key: func(o Override) overridemap.Key { return overridemap.Key{Policy: o.Policy, Subject: o.Subject} },
		Resolve: func(o Override) (*Policy, bool) {
			p, err := l.overridden(o)
			return p, err == nil && p != nil
		},
		Clock: l.clock,
	}
	if st, ok := l.store.(overrideStore); ok {
		l.ovrStore, cfg.Read = st, st.Overrides
	}
	l.ovr = overridemap.New(cfg, append([]Override(nil), opts.Overrides...), ps)
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
		if lq = lq.withDefaults(); checkLocalQuota(lq.fields(), func(_, _, _ string) error { return errTooSmall }) == nil {
			q = lq
		}
	}
	return &q, nil
}

// errTooSmall marks numbers too small for local quota's blocks.
var errTooSmall = errors.New("too small for blocks")

// applyOverrides is the overrides stage, the first: it gives each policy
// of d.ev the subject's own numbers where an override names them, or
// failing one for the subject, the one of the first of its Previous
// subjects (its pseudonyms under older keys) that has one, so a key
// rotation keeps a tenant's plan as it keeps the tenant's state. Over a
// store that keeps overrides, overrides read too long ago are read again
// first (overridemap.State.Fresh says how long a Check waits).
func (l *Limiter) applyOverrides(ctx context.Context, d *decision, next step) {
	if m := l.ovr.Fresh(ctx); m.Len() > 0 {
		ev := &d.ev
	policies:
		for i, p := range ev.Policies {
			for j := -1; j < len(ev.Previous); j++ {
				subject := ev.Subject
				if j >= 0 {
					subject = ev.Previous[j]
				}
				if e, ok := m.Get(overridemap.Key{Policy: p.ID, Subject: subject}); ok {
					ev.Policies[i] = e.P
					continue policies
				}
			}
		}
	}
	next(ctx, d)
}

// SetOverride gives o.Subject of policy o.Policy o's numbers, or with
// o.Limit 0 removes its override. The numbers obey Policy.Validate's
// rules for the policy's algorithm; a concurrency policy takes a limit
// only. With a Store that keeps overrides (one with the methods
// PutOverride(ctx, Override) error and Overrides(ctx) ([]Override,
// error), as memstore and redisstore have), the override is stored there
// and every Limiter on it applies it to every decision taken 500ms or
// more after (each reads the store's overrides again before deciding on
// ones read longer ago than that, a failed read not counting); otherwise
// it lives in l. l applies it
// at once.
func (l *Limiter) SetOverride(ctx context.Context, o Override) error {
	if o.Limit < 0 {
		return &policyerr.Error{Policy: o.Policy, Field: "limit", Value: fmt.Sprint(o.Limit), Rule: "must be at least 1, or 0 to remove the override"}
	}
	p, err := l.overridden(o)
	if err != nil {
		return err
	}
	if o.Limit == 0 {
		if err := checkSubject(o.Subject); err != nil {
			return err
		}
		o = Override{Policy: o.Policy, Subject: o.Subject}
	}
	var put func() error
	if l.ovrStore != nil {
		put = func() error {
			if err := l.ovrStore.PutOverride(ctx, o); err != nil {
				return fmt.Errorf("sluice: SetOverride: %w", err)
			}
			return nil
		}
	}
	return l.ovr.Set(o, p, o.Limit == 0, put)
}

// Overrides returns the overrides l applies (those of Options and, with
// a Store that keeps overrides, the ones stored there, read now), by
// policy then subject.
func (l *Limiter) Overrides(ctx context.Context) ([]Override, error) {
	if l.ovrStore != nil {
		if _, err := l.ovr.ReadNow(ctx); err != nil {
			return nil, fmt.Errorf("sluice: Overrides: %w", err)
		}
	}
	return l.ovr.List(), nil
}
