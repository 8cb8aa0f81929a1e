package rlqs

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
)

// domain is one domain's buckets and streams. claimMu orders its ledger
// calls (a round's and first reports'), so that each claim's committed
// amounts are what the reservation it replaces covers; mu guards the
// rest, and is never held across a ledger call.
type domain struct {
	name    string
	claimMu sync.Mutex

	mu      sync.Mutex
	buckets map[string]*bucket // by identity
	streams map[*stream]bool
	fresh   map[*bucket]bool // buckets with a fresh hold
	fleetS  int64            // the most streams the last round's ledger answers saw on one bucket
	outage  bool             // the last ledger call failed
	gauges  map[string]bool
	periods [maxPeriod/time.Second + 1]int // the streams by observed period, in whole seconds (0: none yet)
}

// maxTTL is the longest assignment TTL of d's streams' answers, at least
// ttl(0): the streams' longest period's, ttl rising with the period;
// d.mu held.
func (d *domain) maxTTL() time.Duration {
	for i := len(d.periods) - 1; i > 0; i-- {
		if d.periods[i] > 0 {
			return max(ttl(0), ttl(time.Duration(i)*time.Second))
		}
	}
	return ttl(0)
}

// setPeriod makes st's observed period p (whole seconds, at most
// maxPeriod); d.mu held.
func (d *domain) setPeriod(st *stream, p time.Duration) {
	d.periods[st.period/time.Second]--
	st.period = p
	d.periods[st.period/time.Second]++
}

func newDomain(name string) *domain {
	return &domain{name: name, buckets: map[string]*bucket{}, streams: map[*stream]bool{}, fresh: map[*bucket]bool{}, gauges: map[string]bool{}}
}

// bucket is one bucket of a domain, with the streams that hold it.
type bucket struct {
	key     string
	id      *rlqspb.BucketId // as reported, echoed in every answer
	subject string
	m       *matcher
	policy  sluice.Policy // m's, with its plan
	holds   map[*stream]*holding
	// settled sums the holds of holds not fresh, and fresh are the others:
	// kept as holds come, go and change, so that a first report's claim
	// does not walk every holder (claimFresh).
	settled settled
	fresh   map[*stream]*holding
	// leaving sums the commitments of the holds abandoned since the last
	// round's plan, and left those that plan counted: an abandon is a
	// decrease to nothing, and its Envoy enforces the old assignment
	// until it arrives (within a round: docs/rlqs.md, assumption 1), so
	// it stays committed, as a decrease's old amount does, until the
	// round after the one that follows it.
	leaving, left share
	scratch       scratch // a round's slices of the bucket, under claimMu
	fleet         fleet
	// until is when this instance's ledger entry of the bucket may expire,
	// at the earliest: the send time of the last claim that granted it
	// plus that claim's entry TTL (zero before). No assignment of the
	// bucket is sent to end later (docs/rlqs.md, the bound's assumption 4).
	until   time.Time
	allowed uint64
	denied  uint64
}

// add makes h, fresh, st's hold on b; d.mu held.
func (b *bucket) add(st *stream, h *holding) {
	b.holds[st] = h
	b.fresh[st] = h
}

// drop ends st's hold on b, if any; d.mu held.
func (b *bucket) drop(st *stream) {
	h := b.holds[st]
	if h == nil {
		return
	}
	delete(b.holds, st)
	if h.fresh {
		delete(b.fresh, st)
	} else {
		b.settled.remove(&h.hold)
	}
}

// setDemand sets h's demand (h a hold of b); d.mu held.
func (b *bucket) setDemand(h *holding, demand int64) {
	if !h.fresh {
		b.settled.demand += demand - h.demand
	}
	h.demand = demand
}

// settle moves st's hold h, made not fresh, from fresh to settled, if it
// is still st's hold on b; d.mu held.
func (b *bucket) settle(st *stream, h *holding) {
	if b.holds[st] != h || b.fresh[st] != h {
		return
	}
	delete(b.fresh, st)
	b.settled.add(&h.hold)
}

// resum sums b's holds again, after a round changed them; d.mu held.
func (b *bucket) resum() {
	b.settled = settled{}
	clear(b.fresh)
	for st, h := range b.holds {
		if h.fresh {
			b.fresh[st] = h
		} else {
			b.settled.add(&h.hold)
		}
	}
}

// holding is a stream's hold on a bucket.
type holding struct {
	hold
	zeros int // consecutive reports of nothing
}

// stream is one Envoy's stream: a client.
type stream struct {
	d      *domain // nil: a domain no config names (every bucket unmatched)
	name   string
	holds  map[string]*bucket // by identity; guarded by d.mu
	period time.Duration      // observed; guarded by d.mu
	out    mailbox
	cancel context.CancelCauseFunc
	idBuf  []byte // the identity of the bucket a report's handler is at
}

// ttl is the assignment TTL of st's answers; d.mu held.
func (st *stream) ttl() time.Duration { return ttl(st.period) }

// StreamRateLimitQuotas serves one Envoy's stream: its first message
// names the domain; every report is answered at once with the assignment
// of each bucket it reports, and rounds push changed assignments. One
// writer goroutine sends, latest answer of each bucket first come.
func (s *Service) StreamRateLimitQuotas(gs rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "sluice: rlqs: shutting down")
	}
	ctx, cancel := context.WithCancelCause(gs.Context())
	defer cancel(nil)
	st := &stream{holds: map[string]*bucket{}, cancel: cancel, out: newMailbox()}
	st.out.sending = s.opts.sending
	s.all[st] = true
	s.streams.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.all, st)
		s.mu.Unlock()
		s.streams.Done()
	}()
	written := make(chan struct{})
	go func() { defer close(written); st.out.write(ctx, gs, s.opts.Clock, cancel) }()
	defer func() {
		cancel(nil)
		if !st.out.quit() {
			<-written
		}
		// else a send is under way, and may block until the stream ends
		// (a client that does not read): returning ends it, gRPC's Send
		// then fails and the writer ends.
		s.leave(st)
		if s.opts.left != nil {
			s.opts.left()
		}
	}()
	recv := make(chan *rlqspb.RateLimitQuotaUsageReports)
	failed := make(chan error, 1)
	go func() {
		for {
			m, err := gs.Recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case recv <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ended(context.Cause(ctx))
		case err := <-failed:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-recv:
			if err := s.report(ctx, st, m); err != nil {
				return err
			}
		}
	}
}

// Why a stream was ended by the server.
var (
	errShutdown = errors.New("shutting down")
	errSlow     = errors.New("stream too slow: an answer waited longer than a round to be sent")
)

func ended(cause error) error {
	switch {
	case errors.Is(cause, errShutdown):
		return nil
	case errors.Is(cause, errSlow):
		return status.Error(codes.ResourceExhausted, "sluice: rlqs: "+cause.Error())
	}
	return status.FromContextError(cause).Err()
}

// report handles one message of st: checks it, takes its domain if it is
// the first, and answers every bucket it reports.
func (s *Service) report(ctx context.Context, st *stream, m *rlqspb.RateLimitQuotaUsageReports) error {
	if s.ending.Load() {
		return nil // TTL 0 was sent: nothing more is assigned
	}
	cfg := s.cfg.Load()
	if st.name == "" {
		if m.GetDomain() == "" {
			return status.Error(codes.InvalidArgument, "sluice: rlqs: domain: empty: the first message must name the domain")
		}
		s.join(st, m.GetDomain())
	}
	if err := checkReport(m); err != nil {
		return status.Error(codes.InvalidArgument, "sluice: rlqs: "+err.Error())
	}
	if st.d == nil {
		acts := make([]*rlqspb.RateLimitQuotaResponse_BucketAction, 0, len(m.GetBucketQuotaUsages()))
		for _, u := range m.GetBucketQuotaUsages() {
			acts = append(acts, assign(u.GetBucketId(), blanket(typepb.RateLimitStrategy_ALLOW_ALL), ttl(0)))
		}
		s.opts.Metrics.unmatched(unknownDomain, len(acts))
		st.out.put(acts, nil)
		return nil
	}
	fresh, answers := s.take(st, cfg, m)
	if fresh {
		s.claimFresh(ctx, st.d)
	}
	s.answer(st, answers)
	return nil
}

// join attaches st to its domain.
func (s *Service) join(st *stream, name string) {
	st.name = name
	s.mu.Lock()
	st.d = s.domains[name]
	s.mu.Unlock()
	if st.d == nil {
		return
	}
	st.d.mu.Lock()
	st.d.streams[st] = true
	st.d.periods[0]++
	st.d.mu.Unlock()
}

// leave frees st's shares: the next round gives them to others.
func (s *Service) leave(st *stream) {
	d := st.d
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range st.holds {
		b.drop(st)
	}
	st.holds = nil
	delete(d.streams, st)
	d.periods[st.period/time.Second]--
}

// reply is how one reported bucket is answered.
type reply struct {
	id       *rlqspb.BucketId
	key      string  // its identity, when known ("": put finds it)
	b        *bucket // held: its assignment
	overflow *sluice.Policy
	abandon  bool
}

// take records m's usage in st's domain and returns whether a bucket is
// fresh (to be claimed at once) and how to answer each reported bucket.
func (s *Service) take(st *stream, cfg *config, m *rlqspb.RateLimitQuotaUsageReports) (bool, []reply) {
	d := st.d
	ms := cfg.domains[d.name]
	d.mu.Lock()
	defer d.mu.Unlock()
	var fresh bool
	var unmatched int
	replies := make([]reply, 0, len(m.GetBucketQuotaUsages()))
	for _, u := range m.GetBucketQuotaUsages() {
		id := u.GetBucketId()
		st.idBuf = appendIdentity(st.idBuf[:0], id.GetBucket())
		b := st.holds[string(st.idBuf)] // no string made
		if b == nil {
			mt := match(ms, id.GetBucket())
			if mt == nil {
				unmatched++
				replies = append(replies, reply{id: id})
				continue
			}
			b = s.hold(st, cfg, mt, string(st.idBuf), id)
			if b == nil { // past a cap: the overflow answer, of the bucket's plan if it has one
				p := mt.policy
				if plans := s.planMap(); len(plans) > 0 {
					p = policyOf(mt, pseudonym(s.opts.Pseudonymizer, d.name, string(st.idBuf)), plans)
				}
				s.opts.Metrics.overflowed(d.name, p.ID)
				replies = append(replies, reply{id: id, overflow: &p})
				continue
			}
			fresh = true
		}
		h := b.holds[st]
		n := u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
		b.allowed += u.GetNumRequestsAllowed()
		b.denied += u.GetNumRequestsDenied()
		s.opts.Metrics.reported(d.name, b.policy.ID, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
		te := u.GetTimeElapsed().AsDuration()
		if !h.fresh && te >= time.Second {
			d.setPeriod(st, min(te.Truncate(time.Second), maxPeriod))
		}
		b.setDemand(h, ewma(h.demand, h.fresh && h.demand == 0, n, te))
		if h.zeros = h.zeros + 1; n > 0 {
			h.zeros = 0
		}
		if h.zeros >= 3 { // idle: abandoned, its share freed once applied
			b.leaving = b.leaving.plus(h.committed.max(h.assigned))
			b.drop(st)
			delete(st.holds, b.key)
			replies = append(replies, reply{id: id, key: b.key, abandon: true})
			continue
		}
		replies = append(replies, reply{id: id, key: b.key, b: b})
	}
	s.opts.Metrics.unmatched(d.name, unmatched)
	return fresh, replies
}

// hold makes st a holder of the bucket key (matched by mt), fresh, or
// returns nil past the per-stream or per-domain cap; d.mu held.
func (s *Service) hold(st *stream, cfg *config, mt *matcher, key string, id *rlqspb.BucketId) *bucket {
	d := st.d
	if len(st.holds) >= cfg.MaxBucketsPerStream {
		return nil
	}
	b := d.buckets[key]
	if b == nil {
		if len(d.buckets) >= cfg.MaxBucketsPerDomain {
			return nil
		}
		subj := pseudonym(s.opts.Pseudonymizer, d.name, key)
		b = &bucket{key: key, id: proto.Clone(id).(*rlqspb.BucketId), subject: subj, m: mt,
			holds: map[*stream]*holding{}, fresh: map[*stream]*holding{}}
		b.policy = policyOf(mt, subj, s.planMap())
		d.buckets[key] = b
	}
	b.add(st, &holding{hold: hold{fresh: true}})
	d.fresh[b] = true
	st.holds[key] = b
	return b
}

// answer puts replies as bucket actions: a held bucket's current
// assignment, its TTL cut to end when the bucket's ledger entry may
// expire (none once it may have: a ledger outage lets it expire),
// ALLOW_ALL when unmatched, the overflow share, or abandon. Nothing once
// Shutdown began: it sets ending before it takes d.mu to put TTL 0, so
// an answer put under d.mu either comes before the TTL 0 (which replaces
// or follows it) or is not put at all.
func (s *Service) answer(st *stream, rs []reply) {
	d := st.d
	now := s.opts.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.ending.Load() {
		return
	}
	l := st.ttl()
	acts := make([]*rlqspb.RateLimitQuotaResponse_BucketAction, 0, len(rs))
	keys := make([]string, 0, len(rs))
	for _, r := range rs {
		n := len(acts)
		switch {
		case r.abandon:
			acts = append(acts, &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: r.id,
				BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
		case r.overflow != nil:
			acts = append(acts, assign(r.id, strategy(s.overflowShare(d, *r.overflow)), l))
		case r.b == nil:
			acts = append(acts, assign(r.id, blanket(typepb.RateLimitStrategy_ALLOW_ALL), l))
		default:
			h := r.b.holds[st]
			if h == nil || h.fresh || !r.b.until.After(now) {
				continue
			}
			acts = append(acts, assign(r.id, strategy(h.assigned), r.b.ttl(l, now)))
		}
		if len(acts) > n {
			keys = append(keys, r.key)
		}
	}
	st.out.put(acts, keys)
}

// ttl is the TTL of an assignment of b sent at now to a stream whose
// TTL is l: l, cut so that it ends no later than b.until.
func (b *bucket) ttl(l time.Duration, now time.Time) time.Duration {
	return max(min(l, b.until.Sub(now)), 0)
}

// overflowShare is the answer past a cap: the policy split equally over
// the domain's streams (the most the last round's ledger answers saw on
// one bucket, or this instance's, at least 1); d.mu held.
func (s *Service) overflowShare(d *domain, p sluice.Policy) share {
	n := max(d.fleetS, int64(len(d.streams)), 1)
	ps := policyShare(p)
	return share{ps.rate / n, ps.burst / n}
}

// assign is the action assigning strategy st to id for ttl.
func assign(id *rlqspb.BucketId, st *typepb.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: st}}}
}
