package grpclimit_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// reportUnary stands for a handler that reports what the call cost in
// the trailer: the value the client sent as x-used ("panic" panics).
func reportUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-used"); len(v) > 0 {
		if v[0] == "panic" {
			panic("handler panics")
		}
		grpc.SetTrailer(ctx, metadata.Pairs("x-tokens-used", v[0]))
	}
	return h(ctx, req)
}

// reportStream is reportUnary for a stream, through its own SetTrailer.
func reportStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	if v := md.Get("x-used"); len(v) > 0 {
		ss.SetTrailer(metadata.Pairs("x-tokens-used", v[0]))
	}
	return h(srv, ss)
}

// TestSettleTrailer: a method with a SettleTrailer spends its Cost as an
// estimate and settles it, once the handler returns, with what the
// handler set in that trailer; at the estimate when it set nothing or
// panicked. Each call's RateLimit trailer shows what its estimate left:
// the previous call's settle is done before its answer is sent.
func TestSettleTrailer(t *testing.T) {
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Methods: []grpclimit.Method{
		{Name: "/test.Echo/", Policies: []string{"api"}, Cost: 10, SettleTrailer: "X-Tokens-Used"},
	}}, sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Hour, DedupeTTL: time.Minute})
	s := serve(t, []grpc.UnaryServerInterceptor{ints.Unary(), reportUnary}, []grpc.StreamServerInterceptor{ints.Stream(), reportStream})
	for i, tc := range []struct {
		used string // reported; "" nothing
		left int    // in the call's trailer: after its estimate
	}{{"4", 90}, {"30", 86}, {"", 56}, {"0", 46}, {"panic", 46}, {"0", 36}} {
		var md []string
		if tc.used != "" {
			md = []string{"x-used", tc.used}
		}
		trailer, err := s.call(t, echoUnary, md...)
		if tc.used == "panic" {
			wantCode(t, "a panicking call", err, codes.Internal)
			continue
		}
		wantCode(t, "call", err, codes.OK)
		if got := strings.Join(trailer.Get("ratelimit"), ","); !strings.Contains(got, ";r="+strconv.Itoa(tc.left)+";") {
			t.Fatalf("call %d (reports %q): ratelimit trailer %q, want %d remaining", i, tc.used, got, tc.left)
		}
	}
	// Call 6 settled at 0 (46 left); a stream then reports 2 of its 10
	// through its own SetTrailer (44 left): the next call's estimate
	// leaves 34.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-used", "2")
	cs := s.openStream(t, ctx)
	cs.CloseSend()
	for recv(cs) == nil {
	}
	<-s.ended
	trailer, err := s.call(t, echoUnary, "x-used", "0")
	wantCode(t, "call after the stream", err, codes.OK)
	if got := strings.Join(trailer.Get("ratelimit"), ","); !strings.Contains(got, ";r=34;") {
		t.Fatalf("after a stream that reported 2 of its 10: ratelimit trailer %q, want 34 remaining", got)
	}
	store, _ := memstore.New(memstore.Options{SweepInterval: -1})
	defer store.Close()
	lim, _ := sluice.New(store, []sluice.Policy{{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Hour}}, sluice.Options{})
	if _, err := grpclimit.New(lim, grpclimit.Options{Methods: []grpclimit.Method{{Name: "/a.B/C", Policies: []string{"api"}, SettleTrailer: "x-cost-bin"}}}); err == nil || !strings.Contains(err.Error(), "SettleTrailer") {
		t.Errorf("a binary trailer key: New = %v, want an error naming SettleTrailer", err)
	}
}
