package rlqs

import (
	"context"
	"slices"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice"
)

// mailbox holds a stream's answers until its writer sends them: the
// latest action of each bucket replaces an earlier one not yet sent, so
// a put never blocks (a round never waits for a stream).
type mailbox struct {
	mu       sync.Mutex
	pending  map[string]int // by bucket identity, the index in acts of its action
	acts     []*rlqspb.RateLimitQuotaResponse_BucketAction
	idBuf    []byte        // the identity put is at
	sending  func()        // called before each send (tests); may be nil
	since    time.Time     // when the send under way began; zero when none is
	dead     bool          // the writer is gone
	quitting bool          // the handler is returning: nothing more is taken
	drained  chan struct{} // closed when pending is empty and nothing is being sent
	wake     chan struct{}
}

func newMailbox() mailbox {
	return mailbox{pending: map[string]int{}, wake: make(chan struct{}, 1)}
}

// put queues acts; keys, when not nil, are their buckets' identities,
// where known ("": put finds it).
func (mb *mailbox) put(acts []*rlqspb.RateLimitQuotaResponse_BucketAction, keys []string) {
	if len(acts) == 0 {
		return
	}
	mb.mu.Lock()
	for i, a := range acts {
		var k string
		if keys != nil {
			k = keys[i]
		}
		var j int
		var ok bool
		if k == "" {
			mb.idBuf = appendIdentity(mb.idBuf[:0], a.GetBucketId().GetBucket())
			if j, ok = mb.pending[string(mb.idBuf)]; !ok { // no string made
				k = string(mb.idBuf)
			}
		} else {
			j, ok = mb.pending[k]
		}
		if ok {
			mb.acts[j] = a
			continue
		}
		mb.pending[k] = len(mb.acts)
		mb.acts = append(mb.acts, a)
	}
	mb.mu.Unlock()
	select {
	case mb.wake <- struct{}{}:
	default:
	}
}

// write sends what is put, in order, until ctx ends or a send fails
// (which ends the stream).
func (mb *mailbox) write(ctx context.Context, gs rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, clock sluice.Clock, cancel context.CancelCauseFunc) {
	defer mb.close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-mb.wake:
		}
		for resp := mb.take(clock.Now()); resp != nil; resp = mb.take(clock.Now()) {
			if mb.sending != nil {
				mb.sending()
			}
			if err := gs.Send(resp); err != nil {
				cancel(err)
				return
			}
		}
	}
}

// take returns what is pending as one response, marking a send under
// way since now, or nil (and marks mb drained) when nothing is.
func (mb *mailbox) take(now time.Time) *rlqspb.RateLimitQuotaResponse {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if len(mb.acts) == 0 || mb.quitting {
		mb.since = time.Time{}
		if mb.drained != nil {
			close(mb.drained)
			mb.drained = nil
		}
		return nil
	}
	resp := &rlqspb.RateLimitQuotaResponse{BucketAction: slices.Clone(mb.acts)}
	clear(mb.pending)
	clear(mb.acts)
	mb.acts, mb.since = mb.acts[:0], now
	return resp
}

// quit makes take return nothing more, and reports whether a send is
// under way (the writer may then be blocked in it).
func (mb *mailbox) quit() (sending bool) {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	mb.quitting = true
	return !mb.dead && !mb.since.IsZero()
}

// close marks mb's writer gone: a flush waits for nothing more.
func (mb *mailbox) close() {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	mb.dead, mb.since = true, time.Time{}
	if mb.drained != nil {
		close(mb.drained)
		mb.drained = nil
	}
}

// flush waits until everything put before it was sent, the writer is
// gone, or ctx ends.
func (mb *mailbox) flush(ctx context.Context) {
	mb.mu.Lock()
	if mb.dead || len(mb.acts) == 0 && mb.since.IsZero() {
		mb.mu.Unlock()
		return
	}
	if mb.drained == nil {
		mb.drained = make(chan struct{})
	}
	ch := mb.drained
	mb.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// stuck reports whether a send has been under way for longer than limit
// at now.
func (mb *mailbox) stuck(now time.Time, limit time.Duration) bool {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	return !mb.since.IsZero() && now.Sub(mb.since) > limit
}
