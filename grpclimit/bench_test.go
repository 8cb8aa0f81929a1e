package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/subject"
)

// benchInterceptors limits echoUnary by client address behind a trusted
// proxy, on a memstore, with a limit never reached.
func benchInterceptors(b *testing.B) (*grpclimit.Interceptors, *sluice.Limiter) {
	b.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	l, err := sluice.New(st, []sluice.Policy{{ID: "api", Algorithm: sluice.GCRA, Limit: 1_000_000_000, Window: time.Second}}, sluice.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		b.Fatal(err)
	}
	ints, err := grpclimit.New(l, grpclimit.Options{Methods: []grpclimit.Method{{Name: echoUnary, Policies: []string{"api"}, Subject: subject.ClientIP(ips)}}})
	if err != nil {
		b.Fatal(err)
	}
	return ints, l
}

// benchContext is a server call's context as grpc makes it: the peer, the
// metadata, and the call's stream, which takes the trailer.
func benchContext() context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 5555}})
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-forwarded-for", "203.0.113.7, 10.0.0.2"))
	return grpc.NewContextWithServerTransportStream(ctx, &trailerStream{})
}

// trailerStream keeps the trailer a call sets, as grpc's own stream would
// until it sends it; without one, SetTrailer's error (which formats the
// whole context) would be most of what the benchmark measures.
type trailerStream struct{ md metadata.MD }

func (s *trailerStream) Method() string                  { return echoUnary }
func (s *trailerStream) SetHeader(metadata.MD) error     { return nil }
func (s *trailerStream) SendHeader(metadata.MD) error    { return nil }
func (s *trailerStream) SetTrailer(md metadata.MD) error { s.md = md; return nil }

// BenchmarkUnary is the unary interceptor's own cost, called without a
// socket; /check is the floor beside it: the Limiter's Check of the same
// decision, subject already pseudonymized.
func BenchmarkUnary(b *testing.B) {
	ints, l := benchInterceptors(b)
	b.Run("interceptor", func(b *testing.B) {
		unary := ints.Unary()
		ctx, info := benchContext(), &grpc.UnaryServerInfo{FullMethod: echoUnary}
		handler := func(ctx context.Context, req any) (any, error) { return req, nil }
		b.ReportAllocs()
		for b.Loop() {
			if _, err := unary(ctx, nil, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("check", func(b *testing.B) {
		req := sluice.Request{Policy: "api", Subject: subject.Unkeyed().Pseudonym("ip", "203.0.113.7/32", echoUnary)}
		b.ReportAllocs()
		for b.Loop() {
			if o := l.Check(context.Background(), req); o.Kind != sluice.Allowed {
				b.Fatal(o)
			}
		}
	})
}

func BenchmarkUnaryParallel(b *testing.B) {
	ints, _ := benchInterceptors(b)
	unary := ints.Unary()
	info := &grpc.UnaryServerInfo{FullMethod: echoUnary}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := benchContext()
		for pb.Next() {
			if _, err := unary(ctx, nil, info, handler); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCall is a unary call over a loopback socket: /plain through
// no interceptor, /limited through grpclimit's, the difference being
// what a user's call pays.
func BenchmarkCall(b *testing.B) {
	ints, _ := benchInterceptors(b)
	for _, tc := range []struct {
		name  string
		unary []grpc.UnaryServerInterceptor
	}{{"plain", nil}, {"limited", []grpc.UnaryServerInterceptor{ints.Unary()}}} {
		b.Run(tc.name, func(b *testing.B) {
			s := serve(b, tc.unary, nil)
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", "203.0.113.7")
			in, out := wrapperspb.String("hi"), new(wrapperspb.StringValue)
			b.ReportAllocs()
			for b.Loop() {
				if err := s.conn.Invoke(ctx, echoUnary, in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
