package envoyrlqs_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
)

// server is a tiny RLQS server for the kit's own tests: it answers every
// report with one response holding, for each reported bucket, the action
// the test set for it (an assignment with the TTL set, or nothing), and
// lets the test push a response or end the stream.
type server struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	addr string

	mu      sync.Mutex
	actions map[string]*rlqspb.RateLimitQuotaResponse_BucketAction // by envoyrlqs.Key
	reports []*rlqspb.RateLimitQuotaUsageReports
	got     chan struct{} // closed and replaced on every report
	push    chan *rlqspb.RateLimitQuotaResponse
	end     chan struct{}
	streams int
}

// startServer serves on a free loopback port until the test ends.
func startServer(t *testing.T) *server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: l.Addr().String(), actions: map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{},
		got: make(chan struct{}), push: make(chan *rlqspb.RateLimitQuotaResponse), end: make(chan struct{})}
	g := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(g, s)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return s
}

// assign sets what reports of id are answered with: strategy for ttl.
func (s *server) assign(id map[string]string, strategy *typev3.RateLimitStrategy, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.actions[envoyrlqs.Key(id)] = assignment(id, strategy, ttl)
}

// assignment is a quota assignment action.
func assignment(id map[string]string, strategy *typev3.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: strategy,
			}}}
}

// abandon is an abandon action.
func abandon(id map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}

// StreamRateLimitQuotas answers reports, pushes and ends on one goroutine
// (a stream's sends must not race).
func (s *server) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	in := make(chan *rlqspb.RateLimitQuotaUsageReports)
	go func() {
		defer close(in)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			in <- r
		}
	}()
	for {
		select {
		case r, ok := <-in:
			if !ok {
				return nil
			}
			if resp := s.answer(r); resp != nil {
				if err := st.Send(resp); err != nil {
					return err
				}
			}
		case resp := <-s.push:
			if err := st.Send(resp); err != nil {
				return err
			}
		case <-s.end:
			return nil
		}
	}
}

// answer files r and builds its answer (nil when no bucket has an action).
func (s *server) answer(r *rlqspb.RateLimitQuotaUsageReports) *rlqspb.RateLimitQuotaResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports = append(s.reports, proto.Clone(r).(*rlqspb.RateLimitQuotaUsageReports))
	close(s.got)
	s.got = make(chan struct{})
	resp := &rlqspb.RateLimitQuotaResponse{}
	for _, u := range r.GetBucketQuotaUsages() {
		if a := s.actions[envoyrlqs.Key(u.GetBucketId().GetBucket())]; a != nil {
			resp.BucketAction = append(resp.BucketAction, proto.Clone(a).(*rlqspb.RateLimitQuotaResponse_BucketAction))
		}
	}
	if len(resp.BucketAction) == 0 {
		return nil
	}
	return resp
}

// awaitReports waits until the server has received n reports and returns
// them.
func (s *server) awaitReports(ctx context.Context, t *testing.T, n int) []*rlqspb.RateLimitQuotaUsageReports {
	t.Helper()
	for {
		s.mu.Lock()
		got, wake := s.reports, s.got
		s.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-wake:
		case <-ctx.Done():
			t.Fatalf("server got %d reports, want %d: %v", len(got), n, ctx.Err())
		}
	}
}

// send pushes resp on the open stream and waits until p applied it.
func (s *server) send(ctx context.Context, t *testing.T, p *envoyrlqs.Proxy, actions ...*rlqspb.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	n := p.Responses()
	select {
	case s.push <- &rlqspb.RateLimitQuotaResponse{BucketAction: actions}:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := p.AwaitResponses(ctx, n+1); err != nil {
		t.Fatal(err)
	}
}
