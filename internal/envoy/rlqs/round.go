package rlqs

import (
	"context"
	"log/slog"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
)

// round runs one split round: the plans read once, then per domain one
// ledger call for all its buckets, the split and the pushes of what
// changed.
func (s *Service) round(ctx context.Context) {
	s.readPlans(ctx)
	cfg := s.cfg.Load()
	for _, d := range s.domainList() {
		s.roundDomain(ctx, cfg, d)
	}
}

// readPlans reads the tenant plans, keeping the last ones read when the
// read fails.
func (s *Service) readPlans(ctx context.Context) {
	if s.opts.Overrides == nil {
		return
	}
	os, err := s.opts.Overrides(ctx)
	if err != nil {
		if ok, n := s.planLog.Allow(s.opts.Clock.Now()); ok {
			s.opts.Logger.Warn("rlqs: cannot read the tenant plans; the last ones read apply", slog.Any("error", err), slog.Int64("suppressed", n))
		}
		return
	}
	m := make(map[planKey]sluice.Override, len(os))
	for _, o := range os {
		m[planKey{o.Policy, o.Subject}] = o
	}
	s.plans.Store(&m)
}

// planMap is the plans last read (nil before).
func (s *Service) planMap() map[planKey]sluice.Override {
	if p := s.plans.Load(); p != nil {
		return *p
	}
	return nil
}

// roundPlan is a domain's round between its two halves: the buckets, the
// holds as they were planned (a stream that leaves meanwhile is dropped
// from its bucket, not from here) and their claims and wants.
type roundPlan struct {
	buckets []*bucket
	holds   [][]*hold
	streams [][]*stream // the holder of each hold
	wants   [][]share
	claims  []ledger.Claim
	ttl     time.Duration
}

// roundDomain runs d's round: claimMu held throughout, d.mu in the two
// halves but not across the ledger call.
func (s *Service) roundDomain(ctx context.Context, cfg *config, d *domain) {
	start := s.opts.Clock.Now()
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	rp := s.planRound(cfg, d)
	var gs []ledger.Grant
	var err error
	sent := s.opts.Clock.Now() // the entries expire rp.ttl after the ledger's now, which is no earlier
	gs, err = s.claimAll(ctx, d, rp.claims, rp.ttl)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		if !d.outage {
			d.outage = true
			s.opts.Logger.Warn("rlqs: the ledger cannot be reached: assignments stay as they are until their TTL, then expire",
				slog.String("domain", d.name), slog.Any("error", err))
		}
	} else if d.outage {
		d.outage = false
		s.opts.Logger.Info("rlqs: the ledger answers again", slog.String("domain", d.name))
	}
	s.applyRound(d, rp, gs, sent.Add(rp.ttl))
	for _, b := range rp.buckets {
		b.scratch.release()
	}
	s.endSlow(d, cfg.Round)
	s.opts.Metrics.roundDone(d, s.opts.Clock.Now().Sub(start))
}

// planRound re-matches d's buckets (a Swap may have changed them), lets
// go those no matcher matches, and plans the split of each; d.mu held
// inside.
func (s *Service) planRound(cfg *config, d *domain) *roundPlan {
	ms := cfg.domains[d.name] // nil for a domain Swap removed: every bucket let go
	plans := s.planMap()
	d.mu.Lock()
	defer d.mu.Unlock()
	rp := &roundPlan{ttl: d.maxTTL() + cfg.Round}
	for _, b := range d.buckets {
		if b.m = match(ms, b.id.GetBucket()); b.m == nil {
			for st := range b.holds {
				delete(st.holds, b.key)
			}
			clear(b.holds)
		} else {
			b.policy = policyOf(b.m, b.subject, plans)
		}
		p := policyShare(b.policy)
		sc := b.scratch.take(len(b.holds))
		hs, sts := sc.hs[:0], sc.sts[:0]
		for st, h := range b.holds {
			hs, sts = append(hs, &h.hold), append(sts, st)
		}
		n, total := b.fleet.now(hs)
		want := sc.want[:len(hs)]
		c := planInto(p, n, total, hs, want)
		b.resum() // plan made each committed its assignment
		b.left, b.leaving = b.leaving, share{}
		c.Committed, c.CommittedBurst = c.Committed+b.left.rate, c.CommittedBurst+b.left.burst
		c.Bucket = b.subject
		rp.buckets, rp.holds, rp.streams = append(rp.buckets, b), append(rp.holds, hs), append(rp.streams, sts)
		rp.wants, rp.claims = append(rp.wants, want), append(rp.claims, c)
	}
	return rp
}

// claimAll claims cs for d in calls of at most ledger.MaxClaims, in
// order: one call holds Redis (its shard) for as long as it runs, and must
// not for long; each claim is atomic on its own bucket, which is all the
// reservations' invariant needs. It returns the grants of the calls that
// succeeded, in order, and the error of the first that failed (the rest
// are not sent).
func (s *Service) claimAll(ctx context.Context, d *domain, cs []ledger.Claim, ttl time.Duration) ([]ledger.Grant, error) {
	gs := make([]ledger.Grant, 0, len(cs))
	for len(cs) > 0 {
		n := min(len(cs), ledger.MaxClaims)
		s.opts.Metrics.ledgerCall(d.name)
		g, err := s.ledger.Claim(ctx, d.name, s.instance, cs[:n], ttl)
		if err != nil {
			s.opts.Metrics.ledgerError(d.name)
			return gs, err
		}
		gs, cs = append(gs, g...), cs[n:]
	}
	return gs, nil
}

// applyRound settles the planned buckets granted (the first len(gs); the
// others keep their assignments, which their reservations still cover),
// pushes the changed assignments and drops the buckets no stream holds;
// until is when the claimed entries may expire, at the earliest; d.mu
// held.
func (s *Service) applyRound(d *domain, rp *roundPlan, gs []ledger.Grant, until time.Time) {
	now := s.opts.Clock.Now()
	if len(gs) == len(rp.buckets) {
		d.fleetS = 0
	}
	for i, b := range rp.buckets[:len(gs)] {
		g := gs[i]
		b.fleet.update(rp.claims[i], g)
		b.until = until
		d.fleetS = max(d.fleetS, g.Streams)
		k := len(rp.holds[i])
		fitDown(rp.holds[i], rp.wants[i], rp.claims[i], g)
		changed := settleInto(rp.holds[i], rp.wants[i], less(g, b.left), b.scratch.rates[:k], b.scratch.bursts[:k], b.scratch.changed[:k])
		for _, h := range rp.holds[i] {
			h.fresh = false
		}
		b.resum()
		if len(b.fresh) == 0 { // a first report during the ledger call waits for its own claim
			delete(d.fresh, b)
		}
		if len(b.holds) == 0 && rp.claims[i].Streams == 0 {
			delete(d.buckets, b.key)
			continue
		}
		for j, st := range rp.streams[i] {
			if h := b.holds[st]; h != nil && changed[j] {
				st.out.put([]*rlqspb.RateLimitQuotaResponse_BucketAction{assign(b.id, strategy(h.assigned), b.ttl(st.ttl(), now))}, []string{b.key})
			}
		}
	}
}

// endSlow ends the streams of d whose answer has waited longer than a
// round to be sent: the bound assumes delivery within a round, and such
// a stream's Envoy is better off on its expired-assignment behaviour;
// d.mu held.
func (s *Service) endSlow(d *domain, round time.Duration) {
	now := s.opts.Clock.Now()
	for st := range d.streams {
		if st.out.stuck(now, round) {
			s.opts.Logger.Warn("rlqs: ending a stream too slow to take its answers", slog.String("domain", d.name))
			st.cancel(errSlow)
		}
	}
}

// claimFresh claims, at once and in one ledger call, a floor for every
// fresh hold of d (a stream's first report of a bucket), from what the
// policy has free; a round that ran meanwhile may have assigned them
// already.
func (s *Service) claimFresh(ctx context.Context, d *domain) {
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	type freshBucket struct {
		b       *bucket
		settled settled
		sts     []*stream
		hs      []*holding
		n       int64
		gone    share
	}
	var fbs []freshBucket
	var cs []ledger.Claim
	d.mu.Lock()
	for b := range d.fresh {
		delete(d.fresh, b)
		if len(b.fresh) == 0 {
			continue
		}
		fb := freshBucket{b: b, settled: b.settled}
		for st, h := range b.fresh {
			fb.sts, fb.hs = append(fb.sts, st), append(fb.hs, h)
		}
		n, _ := b.fleet.now(nil)
		fb.n = n + b.settled.n
		c := claimFreshOf(policyShare(b.policy), fb.n, fb.settled, holdsOf(fb.hs))
		fb.gone = b.left.plus(b.leaving) // abandons not yet surely applied stay reserved
		c.Committed, c.CommittedBurst = c.Committed+fb.gone.rate, c.CommittedBurst+fb.gone.burst
		c.Wish, c.WishBurst = c.Wish+fb.gone.rate, c.WishBurst+fb.gone.burst
		c.Bucket = b.subject
		fbs, cs = append(fbs, fb), append(cs, c)
	}
	round := s.cfg.Load().Round
	ttl := d.maxTTL() + round
	d.mu.Unlock()
	if len(cs) == 0 {
		return
	}
	sent := s.opts.Clock.Now()
	gs, _ := s.claimAll(ctx, d, cs, ttl)
	d.mu.Lock()
	defer d.mu.Unlock()
	// The buckets of a failed call are not answered, not even DENY_ALL:
	// no_assignment_behavior applies until a round grants.
	for i, fb := range fbs[:len(gs)] {
		fb.b.fleet.update(cs[i], gs[i])
		fb.b.until = sent.Add(ttl)
		settleFreshOf(policyShare(fb.b.policy), fb.n, fb.settled, holdsOf(fb.hs), less(gs[i], fb.gone))
		for j, st := range fb.sts {
			fb.b.settle(st, fb.hs[j])
		}
	}
}

// holdsOf is the holds of hs.
func holdsOf(hs []*holding) []*hold {
	out := make([]*hold, len(hs))
	for i, h := range hs {
		out[i] = &h.hold
	}
	return out
}

// scratch is a bucket's slices of a round, kept from one round to the
// next (rounds run one at a time, under the domain's claimMu), so that a
// round allocates only when a bucket's holders grow.
type scratch struct {
	hs            []*hold
	sts           []*stream
	want          []share
	rates, bursts []int64
	changed       []bool
}

// take returns sc with room for n holds.
func (sc *scratch) take(n int) *scratch {
	if cap(sc.hs) < n {
		c := n + n/4
		*sc = scratch{hs: make([]*hold, 0, c), sts: make([]*stream, 0, c), want: make([]share, c),
			rates: make([]int64, c), bursts: make([]int64, c), changed: make([]bool, c)}
	}
	return sc
}

// release drops sc's pointers, so that a stream gone is not kept.
func (sc *scratch) release() {
	clear(sc.hs[:cap(sc.hs)])
	clear(sc.sts[:cap(sc.sts)])
}
