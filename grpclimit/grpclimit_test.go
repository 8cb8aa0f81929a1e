package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/localquota"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// The test services: "/test.Echo/Unary" and "/test.Other/Unary" answer
// their request; "/test.Echo/Stream" (bidirectional) echoes each message
// until the client closes its side, panics on "panic", and ends with the
// stream's error when the client cancels.
const (
	echoUnary  = "/test.Echo/Unary"
	otherUnary = "/test.Other/Unary"
	echoStream = "/test.Echo/Stream"
)

// serviceDesc is a service of name with a unary method Unary and a
// bidirectional stream Stream, over wrapperspb.StringValue messages.
func serviceDesc(name string) *grpc.ServiceDesc {
	unary := func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) {
			if req.(*wrapperspb.StringValue).GetValue() == "panic" {
				panic("handler panics")
			}
			return req, nil
		}
		if interceptor == nil {
			return h(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + name + "/Unary"}, h)
	}
	return &grpc.ServiceDesc{
		ServiceName: name,
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Unary", Handler: unary}},
		Streams:     []grpc.StreamDesc{{StreamName: "Stream", Handler: echo, ServerStreams: true, ClientStreams: true}},
	}
}

func echo(_ any, ss grpc.ServerStream) error {
	for {
		m := new(wrapperspb.StringValue)
		if err := ss.RecvMsg(m); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if m.GetValue() == "panic" {
			panic("handler panics")
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
}

// recoverUnary and recoverStream answer a handler's panic with
// codes.Internal, as a recovery interceptor outside grpclimit's would.
func recoverUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return h(ctx, req)
}

func recoverStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return h(srv, ss)
}

// server is a real grpc.Server on a loopback port and a client of it.
type server struct {
	conn  *grpc.ClientConn
	ended chan string // a stream's method, once grpclimit's interceptor returned
}

// serve serves the test services through unary and stream interceptors
// (outermost first) behind a recovery interceptor, and an interceptor
// that reports each stream's end on ended.
func serve(t testing.TB, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) *server {
	t.Helper()
	s := &server{ended: make(chan string, 16)}
	ended := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		defer func() { s.ended <- info.FullMethod }()
		return h(srv, ss)
	}
	gs := grpc.NewServer(
		grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{recoverUnary}, unary...)...),
		grpc.ChainStreamInterceptor(append([]grpc.StreamServerInterceptor{recoverStream, ended}, stream...)...),
	)
	gs.RegisterService(serviceDesc("test.Echo"), struct{}{})
	gs.RegisterService(serviceDesc("test.Other"), struct{}{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn = conn
	return s
}

// serveInterceptors serves ints as the server's interceptors.
func serveInterceptors(t *testing.T, ints *grpclimit.Interceptors) *server {
	return serve(t, []grpc.UnaryServerInterceptor{ints.Unary()}, []grpc.StreamServerInterceptor{ints.Stream()})
}

// newInterceptors builds the interceptors over a memstore on clock.
func newInterceptors(t *testing.T, clock sluice.Clock, opts grpclimit.Options, policies ...sluice.Policy) *grpclimit.Interceptors {
	t.Helper()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return newOn(t, store, opts, policies...)
}

func newOn(t *testing.T, store sluice.Store, opts grpclimit.Options, policies ...sluice.Policy) *grpclimit.Interceptors {
	t.Helper()
	lim, err := sluice.New(store, policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ints, err := grpclimit.New(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	return ints
}

// call makes a unary call of method with the metadata pairs md and
// returns its trailer and error.
func (s *server) call(t *testing.T, method string, md ...string) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	var trailer metadata.MD
	out := new(wrapperspb.StringValue)
	err := s.conn.Invoke(ctx, method, wrapperspb.String("hi"), out, grpc.Trailer(&trailer))
	if err == nil && out.GetValue() != "hi" {
		t.Fatalf("%s answered %q, want the echo of %q", method, out.GetValue(), "hi")
	}
	return trailer, err
}

// wantCode checks that err has code want.
func wantCode(t *testing.T, what string, err error, want codes.Code) *status.Status {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != want {
		t.Fatalf("%s = %v, want code %v", what, err, want)
	}
	return st
}

// retryDelay returns the RetryInfo delay of st, failing without one.
func retryDelay(t *testing.T, st *status.Status) time.Duration {
	t.Helper()
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("status %v has no google.rpc.RetryInfo detail; details: %v", st.Err(), st.Details())
	return 0
}

func wantTrailer(t *testing.T, trailer metadata.MD, key, want string) {
	t.Helper()
	if got := trailer.Get(key); len(got) != 1 || got[0] != want {
		t.Errorf("trailer %s = %q, want [%q]", key, got, want)
	}
}

func slidingLog(id string, limit int64, window time.Duration) sluice.Policy {
	return sluice.Policy{ID: id, Algorithm: sluice.SlidingLog, Limit: limit, Window: window}
}

// TestUnaryDeniesTheSixth: 5 per 10s admits five calls, and denies the
// sixth, 2s later, with ResourceExhausted and a RetryInfo of at least the
// 8s until the first call leaves the window; after that delay a call is
// admitted again. The RateLimit fields are in every trailer.
func TestUnaryDeniesTheSixth(t *testing.T) {
	clock := sluicetest.NewClock()
	ints := newInterceptors(t, clock, grpclimit.Options{Methods: []grpclimit.Method{{Name: echoUnary, Policies: []string{"api"}}}},
		slidingLog("api", 5, 10*time.Second))
	s := serveInterceptors(t, ints)
	for i := 1; i <= 5; i++ {
		trailer, err := s.call(t, echoUnary)
		if err != nil {
			t.Fatalf("call %d = %v, want OK", i, err)
		}
		wantTrailer(t, trailer, "ratelimit-policy", `"api";q=5;w=10`)
		wantTrailer(t, trailer, "ratelimit", fmt.Sprintf(`"api";r=%d;t=10`, 5-i))
	}
	clock.Advance(2 * time.Second)
	trailer, err := s.call(t, echoUnary)
	st := wantCode(t, "call 6", err, codes.ResourceExhausted)
	wait := 8 * time.Second
	delay := retryDelay(t, st)
	if delay < wait {
		t.Errorf("call 6: RetryInfo delay %v, want at least the wait, %v", delay, wait)
	}
	wantTrailer(t, trailer, "ratelimit", `"api";r=0;t=8`)
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			quota = q
		}
	}
	if v := quota.GetViolations(); len(v) != 1 || v[0].GetQuotaId() != "api" || v[0].GetSubject() != "ip" || v[0].GetQuotaValue() != 5 {
		t.Errorf("call 6: QuotaFailure = %v, want one violation of policy api, subject kind ip, value 5", quota)
	}
	if !strings.Contains(st.Message(), `"api"`) {
		t.Errorf("call 6: message %q does not name the policy", st.Message())
	}
	if _, err := s.call(t, otherUnary); err != nil {
		t.Errorf("%s, which no rule limits: %v, want OK", otherUnary, err)
	}
	clock.Advance(delay)
	if _, err := s.call(t, echoUnary); err != nil {
		t.Errorf("call 7, after the RetryInfo delay: %v, want OK", err)
	}
}

// openStream opens an echo stream and checks it is admitted: the echo of
// one message comes back, so grpclimit's interceptor has let it through.
func (s *server) openStream(t *testing.T, ctx context.Context) grpc.ClientStream {
	t.Helper()
	cs, err := s.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, echoStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.String("hello")); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return cs
}

func recv(cs grpc.ClientStream) error {
	return cs.RecvMsg(new(wrapperspb.StringValue))
}

// TestStreamHoldsLease: a stream of a concurrency policy of 1 holds its
// lease while open: a second stream is denied, and one is admitted again
// once the first ends, whether it ends by closing, by the client
// canceling or by the handler panicking.
func TestStreamHoldsLease(t *testing.T) {
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Methods: []grpclimit.Method{{Name: "/test.Echo/", Policies: []string{"streams"}}}},
		sluice.Policy{ID: "streams", Algorithm: sluice.Concurrency, Limit: 1, LeaseTTL: time.Minute})
	s := serveInterceptors(t, ints)
	ctx, cancelAll := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelAll()
	admitted := func(what string, cs grpc.ClientStream) {
		t.Helper()
		if err := recv(cs); err != nil {
			t.Fatalf("%s: %v, want the echo", what, err)
		}
	}
	first := s.openStream(t, ctx)
	admitted("first stream", first)

	second := s.openStream(t, ctx)
	st := wantCode(t, "second stream while the first is open", recv(second), codes.ResourceExhausted)
	if d := retryDelay(t, st); d <= 0 || d > time.Minute {
		t.Errorf("second stream: RetryInfo delay %v, want until the lease expires, in (0, 1m]", d)
	}
	wantTrailer(t, second.Trailer(), "ratelimit", `"streams";r=0;t=60`)
	<-s.ended

	if err := first.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := recv(first); !errors.Is(err, io.EOF) {
		t.Fatalf("first stream after CloseSend: %v, want its end", err)
	}
	<-s.ended
	cctx, cancel := context.WithCancel(ctx)
	third := s.openStream(t, cctx)
	admitted("third stream, after the first ended", third)

	cancel()
	<-s.ended
	fourth := s.openStream(t, ctx)
	admitted("fourth stream, after the third was canceled", fourth)

	if err := fourth.SendMsg(wrapperspb.String("panic")); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "fourth stream, whose handler panics", recv(fourth), codes.Internal)
	<-s.ended
	fifth := s.openStream(t, ctx)
	admitted("fifth stream, after the fourth's handler panicked", fifth)
}

// TestUnaryLeaseReleasedOnPanic: a unary call holds its lease during the
// handler and gives it back when the handler panics.
func TestUnaryLeaseReleasedOnPanic(t *testing.T) {
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Default: []string{"calls"}},
		sluice.Policy{ID: "calls", Algorithm: sluice.Concurrency, Limit: 1, LeaseTTL: time.Minute})
	s := serveInterceptors(t, ints)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		err := s.conn.Invoke(ctx, echoUnary, wrapperspb.String("panic"), new(wrapperspb.StringValue))
		wantCode(t, fmt.Sprintf("call %d, whose handler panics", i+1), err, codes.Internal)
	}
	if _, err := s.call(t, echoUnary); err != nil {
		t.Errorf("call after the panics: %v, want OK", err)
	}
}

// TestExactNameWinsOverService: a method's own rule decides its calls,
// its service's rule every other method of the service.
func TestExactNameWinsOverService(t *testing.T) {
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{
		Methods: []grpclimit.Method{
			{Name: "/test.Echo/", Policies: []string{"service"}},
			{Name: echoUnary, Policies: []string{"method"}},
		},
		Default: []string{"rest"},
	}, slidingLog("service", 1, time.Minute), slidingLog("method", 2, time.Minute),
		slidingLog("rest", 3, time.Minute))
	s := serveInterceptors(t, ints)
	trailer, _ := s.call(t, echoUnary)
	wantTrailer(t, trailer, "ratelimit-policy", `"method";q=2;w=60`)
	trailer, _ = s.call(t, otherUnary)
	wantTrailer(t, trailer, "ratelimit-policy", `"rest";q=3;w=60`)
	cs := s.openStream(t, context.Background())
	if err := recv(cs); err != nil {
		t.Fatal(err)
	}
	cs.CloseSend()
	if err := recv(cs); !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	wantTrailer(t, cs.Trailer(), "ratelimit-policy", `"service";q=1;w=60`)
}

// TestUnaryLocalQuota: calls of a hot subject on a local_quota policy are
// admitted from the Limiter's blocks, the store asked once per block.
func TestUnaryLocalQuota(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	tally := new(localquota.Tally)
	lim, err := sluice.New(store, []sluice.Policy{{ID: "api", Algorithm: sluice.GCRA, Limit: 100_000, Window: time.Second, LocalQuota: sluice.LocalQuota{Enabled: true}}}, sluice.Options{OnLocalQuota: tally.Add})
	if err != nil {
		t.Fatal(err)
	}
	ints, err := grpclimit.New(lim, grpclimit.Options{Default: []string{"api"}})
	if err != nil {
		t.Fatal(err)
	}
	s := serveInterceptors(t, ints)
	// Blocks come once the peer has called enough over three block times
	// (300ms): call for at most 10s, until some calls came from one.
	n := 0
	for end := time.Now().Add(10 * time.Second); tally.Stats("api").Local < 20 && time.Now().Before(end); n++ {
		if _, err := s.call(t, echoUnary); err != nil {
			t.Fatalf("call %d = %v, want OK", n+1, err)
		}
	}
	if st := tally.Stats("api"); st.Local == 0 || st.Blocks == 0 {
		t.Errorf("local quota did %+v after %d calls of one peer: want calls admitted from blocks", st, n)
	}
}

// TestMaxDelayHoldsACall: a method with MaxDelay holds a call that would
// be denied for its booked slot, then lets it go on; one whose slot lies
// past MaxDelay is refused at once. gcra 10/s, burst 1 (a slot every
// 100ms) on a store whose clock stands still, MaxDelay 150ms: the first
// call goes on at once, the second is held for the slot 100ms ahead, the
// third's (200ms ahead) is past the bound.
func TestMaxDelayHoldsACall(t *testing.T) {
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Methods: []grpclimit.Method{
		{Name: echoUnary, Policies: []string{"paced"}, MaxDelay: 150 * time.Millisecond},
	}}, sluice.Policy{ID: "paced", Algorithm: sluice.GCRA, Limit: 10, Window: time.Second, Burst: 1})
	s := serveInterceptors(t, ints)
	for i := range 2 {
		if _, err := s.call(t, echoUnary); err != nil {
			t.Fatalf("call %d: %v, want OK (the second held for its slot)", i+1, err)
		}
	}
	_, err := s.call(t, echoUnary)
	wantCode(t, "third call, its slot past MaxDelay", err, codes.ResourceExhausted)
	store, serr := memstore.New(memstore.Options{})
	if serr != nil {
		t.Fatal(serr)
	}
	t.Cleanup(func() { store.Close() })
	lim, lerr := sluice.New(store, []sluice.Policy{{ID: "paced", Algorithm: sluice.GCRA, Limit: 10, Window: time.Second, Burst: 1}}, sluice.Options{})
	if lerr != nil {
		t.Fatal(lerr)
	}
	_, err = grpclimit.New(lim, grpclimit.Options{Methods: []grpclimit.Method{
		{Name: echoUnary, Policies: []string{"paced"}, MaxDelay: time.Second, SettleTrailer: "x-cost"},
	}})
	if err == nil || !strings.Contains(err.Error(), "not with SettleTrailer") {
		t.Errorf("New with MaxDelay and SettleTrailer = %v, want the rule", err)
	}
}
