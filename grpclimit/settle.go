package grpclimit

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/edge"
)

// settles makes r, compiled at at, spend its cost as an estimate to be
// settled with the value of trailer key (Method.SettleTrailer).
func (in *Interceptors) settles(at string, r *rule, key string) error {
	key = strings.ToLower(key)
	if strings.HasSuffix(key, "-bin") || strings.ContainsFunc(key, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.')
	}) {
		return optionError(at+".SettleTrailer", fmt.Sprintf("%q", key), "must be a metadata key of a-z 0-9 - _ . (not -bin), such as x-tokens-used")
	}
	if err := in.core.Estimates(at, r.Rule); err != nil {
		return err
	}
	r.settle = key
	return nil
}

// recorder is the call's transport stream with the value of one trailer
// key recorded as the handler sets it (grpc.SetTrailer reaches it through
// the context).
type recorder struct {
	grpc.ServerTransportStream // nil outside a real server call
	key                        string
	mu                         sync.Mutex
	value                      string
}

// SetTrailer records r's key and passes md on.
func (r *recorder) SetTrailer(md metadata.MD) error {
	r.note(md)
	if r.ServerTransportStream == nil {
		return nil
	}
	return r.ServerTransportStream.SetTrailer(md)
}

// note records the last value of r's key in md.
func (r *recorder) note(md metadata.MD) {
	if v := md.Get(r.key); len(v) > 0 {
		r.mu.Lock()
		r.value = v[len(v)-1]
		r.mu.Unlock()
	}
}

// cost returns the cost the handler reported, or estimate when it
// reported none a settle takes.
func (r *recorder) cost(estimate int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := edge.ParseCost(r.value); ok {
		return n
	}
	return estimate
}

// unarySettled runs handler for the unary call admitted by a's estimate
// of rule r for s, then settles it with the cost the handler reported
// (also when it panics: then at the estimate).
func (in *Interceptors) unarySettled(ctx context.Context, req any, handler grpc.UnaryHandler, r *rule, a *edge.Action, s edge.Subject) (any, error) {
	rec := &recorder{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx), key: r.settle}
	defer func() { in.settleAfter(ctx, r, a, s, rec, recover()) }()
	return handler(grpc.NewContextWithServerTransportStream(ctx, rec), req)
}

// settleAfter settles a's estimate of rule r for s with the cost rec
// recorded, or at the estimate when the handler panicked with p (not
// nil), and then panics with p again.
func (in *Interceptors) settleAfter(ctx context.Context, r *rule, a *edge.Action, s edge.Subject, rec *recorder, p any) {
	cost := r.Cost
	if p == nil {
		cost = rec.cost(r.Cost)
	}
	in.core.Settle(ctx, r.Rule, a, s, cost)
	if p != nil {
		panic(p)
	}
}

// settledStream is a server stream whose trailers are recorded.
type settledStream struct {
	grpc.ServerStream
	rec *recorder
	ctx context.Context
}

// SetTrailer records the stream's settle key and passes md on.
func (s *settledStream) SetTrailer(md metadata.MD) {
	s.rec.note(md)
	s.ServerStream.SetTrailer(md)
}

// Context returns the stream's context, through which grpc.SetTrailer
// reaches the recorder.
func (s *settledStream) Context() context.Context { return s.ctx }

// streamSettled is unarySettled for a stream.
func (in *Interceptors) streamSettled(srv any, ss grpc.ServerStream, handler grpc.StreamHandler, r *rule, a *edge.Action, s edge.Subject) error {
	ctx := ss.Context()
	rec := &recorder{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx), key: r.settle}
	defer func() { in.settleAfter(ctx, r, a, s, rec, recover()) }()
	return handler(srv, &settledStream{ServerStream: ss, rec: rec, ctx: grpc.NewContextWithServerTransportStream(ctx, rec)})
}
