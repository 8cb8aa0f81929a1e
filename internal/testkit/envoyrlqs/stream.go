package envoyrlqs

import (
	"context"
	"errors"
	"sync"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// ErrStreamEnded is returned by Await when a stream that carried a report
// ended before the report was answered.
var ErrStreamEnded = errors.New("envoyrlqs: the stream ended before every report was answered")

// stream is one StreamRateLimitQuotas call.
type stream struct {
	cs     rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc
}

// item is what a stream's receive goroutine hands to the Proxy: a
// response, or the stream's end (err).
type item struct {
	s    *stream
	resp *rlqspb.RateLimitQuotaResponse
	err  error
}

// inbox holds what the receive goroutines got until the Proxy applies it
// (at the start of the test's next call into it), and what Await watches:
// how many responses arrived, the last response naming each bucket, and
// which streams ended. Its lock is taken after the Proxy's, never before.
type inbox struct {
	mu    sync.Mutex
	items []item
	seq   uint64            // responses received
	seen  map[string]uint64 // bucket Key → seq of the last response naming it
	ended map[*stream]bool
	wake  chan struct{} // closed and replaced on every arrival
}

func newInbox() *inbox {
	return &inbox{seen: map[string]uint64{}, ended: map[*stream]bool{}, wake: make(chan struct{})}
}

// put files it and wakes whoever waits.
func (in *inbox) put(it item) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.items = append(in.items, it)
	if it.resp != nil {
		in.seq++
		for _, a := range it.resp.GetBucketAction() {
			in.seen[Key(a.GetBucketId().GetBucket())] = in.seq
		}
	} else {
		in.ended[it.s] = true
	}
	close(in.wake)
	in.wake = make(chan struct{})
}

// take empties the inbox's items.
func (in *inbox) take() []item {
	in.mu.Lock()
	defer in.mu.Unlock()
	items := in.items
	in.items = nil
	return items
}

// pend is a bucket of a report sent on s when seq responses had arrived:
// answered by the next response naming it.
type pend struct {
	key string
	seq uint64
	s   *stream
}

// settle drops the answered reports from the front of pending (in the
// order they were sent) and stops at the first one still waiting. It
// returns what is left, how many were lost to a stream's end, and the
// channel that the next arrival closes.
func (in *inbox) settle(pending []pend) (left []pend, lost int, wake chan struct{}) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for len(pending) > 0 {
		p := pending[0]
		switch {
		case in.seen[p.key] > p.seq:
		case in.ended[p.s]:
			lost++
		default:
			return pending, lost, in.wake
		}
		pending = pending[1:]
	}
	return nil, lost, in.wake
}

// receive hands every message of s to the inbox, then its end.
func receive(in *inbox, s *stream) {
	for {
		r, err := s.cs.Recv()
		if err != nil {
			in.put(item{s: s, err: err})
			return
		}
		in.put(item{s: s, resp: r})
	}
}
