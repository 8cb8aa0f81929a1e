package envoyrlqs

import (
	"context"
	"fmt"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// drain applies what arrived since the last call, at the current virtual
// time, then fires the timers that fall due now (an assignment with TTL 0
// expires at once).
func (p *Proxy) drain() {
	for _, it := range p.in.take() {
		if it.resp != nil {
			p.apply(it.resp)
			continue
		}
		if it.s == p.stream {
			p.stream = nil
			p.ends = append(p.ends, p.now)
		}
	}
	p.fire()
}

// apply is Envoy's onQuotaResponseImpl: each action in order.
func (p *Proxy) apply(r *rlqspb.RateLimitQuotaResponse) {
	for _, a := range r.GetBucketAction() {
		id := a.GetBucketId().GetBucket()
		key := Key(id)
		b := p.buckets[key]
		if len(id) == 0 || b == nil {
			p.event(Event{Key: key, Kind: Ignored})
			continue
		}
		if a.GetAbandonAction() != nil {
			delete(p.buckets, key)
			p.event(Event{Key: key, Kind: Abandoned, TokensBefore: p.tokens(b)})
			continue
		}
		p.assign(b, a.GetQuotaAssignmentAction())
	}
}

// assign applies a quota assignment to b. Blanket rules and token buckets
// apply; a token bucket equal to the cached one keeps its limiter, any
// other starts a new one at the old limiter's fill ratio (full without
// one). requests_per_time_unit and an unset strategy are skipped, leaving
// b as it was. An action with neither an assignment nor abandon_action is
// cached as an empty action (allows) that expires at once, as in Envoy.
func (p *Proxy) assign(b *bucket, qa *rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction) {
	before := p.tokens(b)
	kind := Assigned
	s := qa.GetRateLimitStrategy()
	switch {
	case qa == nil:
		s = &typev3.RateLimitStrategy{}
		b.lim = nil
	case s.GetTokenBucket() != nil:
		if shouldReplace(b.cached, s) {
			b.lim = newLimiter(s.GetTokenBucket(), p.seconds(), b.lim)
		} else {
			kind = Refreshed
		}
	case isBlanket(s):
		b.lim = nil
	default:
		p.event(Event{Key: b.key, Kind: Ignored, Strategy: clone(b.cached), TokensBefore: before, TokensAfter: before})
		return
	}
	ttl := time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second // nanos dropped, unset is 0
	b.cached = clone(s)
	b.falling = false
	b.expiring, b.expireAt = true, p.now+ttl
	p.event(Event{Key: b.key, Kind: kind, Strategy: clone(s), TTL: ttl, TokensBefore: before, TokensAfter: p.tokens(b)})
}

// expire is Envoy's onActionExpirationTimer: without Expired, the bucket
// returns to NoAssignment (no limiter); with it, the fallback applies (a
// token bucket keeps the limiter if equal, else starts at its fill ratio)
// until Expired.Timeout.
func (p *Proxy) expire(b *bucket) {
	before := p.tokens(b)
	b.expiring = false
	if p.opts.Expired == nil {
		b.cached, b.lim = nil, nil
		p.event(Event{Key: b.key, Kind: AssignmentExpired, TokensBefore: before})
		return
	}
	fb := p.opts.Expired.Fallback
	switch {
	case fb.GetTokenBucket() != nil && shouldReplace(b.cached, fb):
		b.lim = newLimiter(fb.GetTokenBucket(), p.seconds(), b.lim)
	case fb.GetTokenBucket() == nil:
		b.lim = nil
	}
	b.cached = clone(fb)
	b.falling = true
	b.fallback = p.now + p.opts.Expired.Timeout.Truncate(time.Second)
	p.event(Event{Key: b.key, Kind: AssignmentExpired, Strategy: clone(fb), TokensBefore: before, TokensAfter: p.tokens(b)})
}

// endFallback is Envoy's onFallbackExpirationTimer: back to NoAssignment.
func (p *Proxy) endFallback(b *bucket) {
	before := p.tokens(b)
	b.falling = false
	b.cached, b.lim = nil, nil
	p.event(Event{Key: b.key, Kind: FallbackEnded, TokensBefore: before})
}

// tokens returns what b's token bucket holds now (0 without one).
func (p *Proxy) tokens(b *bucket) float64 {
	if b.lim == nil {
		return 0
	}
	return b.lim.tokens(p.seconds())
}

// event files e at the current virtual time.
func (p *Proxy) event(e Event) {
	e.At = p.now
	p.events = append(p.events, e)
}

// Await waits until every report sent so far has been answered: for each
// bucket of each report, a later response naming the bucket (an
// assignment or abandon_action) has arrived. Then it applies what
// arrived. It returns ErrStreamEnded (wrapped) when a stream ended with
// reports unanswered, or the context's error.
func (p *Proxy) Await(ctx context.Context) error {
	for {
		p.mu.Lock()
		left, lost, wake := p.in.settle(p.pending)
		p.pending = left
		if len(left) == 0 {
			p.drain()
			p.mu.Unlock()
			if lost > 0 {
				return fmt.Errorf("%w: %d bucket reports unanswered", ErrStreamEnded, lost)
			}
			return nil
		}
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("envoyrlqs: await %d bucket reports: %w", len(left), ctx.Err())
		}
	}
}

// Responses returns how many responses have arrived, on every stream.
func (p *Proxy) Responses() uint64 {
	p.in.mu.Lock()
	defer p.in.mu.Unlock()
	return p.in.seq
}

// AwaitState waits until bucket id's state satisfies ok, applying each
// response as it arrives, and returns that state; or the state when ctx
// ends, with the error. It reads how many responses have arrived before
// it looks at the state, so a response that arrives between the two is
// never waited for again (State, then Responses, would).
func (p *Proxy) AwaitState(ctx context.Context, id map[string]string, ok func(State) bool) (State, error) {
	for {
		n := p.Responses()
		if st := p.State(id); ok(st) {
			return st, nil
		}
		if err := p.AwaitResponses(ctx, n+1); err != nil {
			return p.State(id), err
		}
	}
}

// AwaitResponses waits until at least n responses have arrived (a push
// the test expects: read Responses, act, await one more), then applies
// them.
func (p *Proxy) AwaitResponses(ctx context.Context, n uint64) error {
	for {
		p.in.mu.Lock()
		got, wake := p.in.seq, p.in.wake
		p.in.mu.Unlock()
		if got >= n {
			p.mu.Lock()
			p.drain()
			p.mu.Unlock()
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("envoyrlqs: await response %d (have %d): %w", n, got, ctx.Err())
		}
	}
}
