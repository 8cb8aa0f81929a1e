package rlqs

import (
	"context"
	"log/slog"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// Shutdown stops the rounds and refuses new streams; sends every stream
// every bucket it holds with a TTL of 0 (its Envoy expires them now, to
// its expired_assignment_behavior) and waits until those are sent; one
// round later, when they are applied (delivery within a round: the
// bound's assumption 1), releases this instance's ledger entries, so the
// other instances may regive the shares at their next round; then ends
// every stream. ctx bounds the waits: past it, the entries are not
// released (they expire by themselves: releasing them before the TTL 0
// answers are applied could let the fleet admit more than the bound) and
// the streams end at once.
func (s *Service) Shutdown(ctx context.Context) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.closing = true
	s.ending.Store(true)
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	ds := s.domainList()
	var streams []*stream
	for _, d := range ds {
		d.mu.Lock()
		for st := range d.streams {
			acts := make([]*rlqspb.RateLimitQuotaResponse_BucketAction, 0, len(st.holds))
			keys := make([]string, 0, len(st.holds))
			for _, b := range st.holds {
				acts = append(acts, assign(b.id, strategy(b.holds[st].assigned), 0))
				keys = append(keys, b.key)
			}
			st.out.put(acts, keys)
			streams = append(streams, st)
		}
		d.mu.Unlock()
	}
	for _, st := range streams {
		st.out.flush(ctx)
	}
	after := s.opts.after
	if after == nil {
		after = time.After
	}
	select {
	case <-after(s.cfg.Load().Round):
		s.release(ctx, ds)
	case <-ctx.Done():
		s.opts.Logger.Warn("rlqs: shutdown ran out of time before the TTL 0 answers were surely applied; this instance's ledger entries expire by themselves")
	}
	s.mu.Lock()
	for st := range s.all {
		st.cancel(errShutdown)
	}
	s.mu.Unlock()
	s.streams.Wait()
}

// release releases this instance's ledger entries of every domain of ds.
func (s *Service) release(ctx context.Context, ds []*domain) {
	for _, d := range ds {
		d.claimMu.Lock()
		if err := s.ledger.Release(ctx, d.name, s.instance); err != nil {
			s.opts.Logger.Warn("rlqs: cannot release this instance's ledger entries; they expire by themselves", slog.String("domain", d.name), slog.Any("error", err))
		}
		d.claimMu.Unlock()
	}
}
