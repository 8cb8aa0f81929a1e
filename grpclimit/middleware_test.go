package grpclimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/sluicetest"
)

// Interceptors is a go-grpc-middleware ratelimit.Limiter.
var _ ratelimit.Limiter = (*grpclimit.Interceptors)(nil)

// TestGoGRPCMiddleware chains go-grpc-middleware's own ratelimit
// interceptors over Interceptors.Limit: the sixth call of 5 per 10s is
// refused (ResourceExhausted, their message quoting ours, the RateLimit
// fields in the trailer), and a method that needs a lease is refused,
// since their interface has no call to release it.
func TestGoGRPCMiddleware(t *testing.T) {
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Methods: []grpclimit.Method{
		{Name: echoUnary, Policies: []string{"api"}},
		{Name: otherUnary, Policies: []string{"calls"}},
	}}, slidingLog("api", 5, 10*time.Second), sluice.Policy{ID: "calls", Algorithm: sluice.Concurrency, Limit: 1, LeaseTTL: time.Minute})
	s := serve(t, []grpc.UnaryServerInterceptor{ratelimit.UnaryServerInterceptor(ints)}, []grpc.StreamServerInterceptor{ratelimit.StreamServerInterceptor(ints)})
	for i := 1; i <= 5; i++ {
		trailer, err := s.call(t, echoUnary)
		wantCode(t, "call", err, codes.OK)
		wantTrailer(t, trailer, "ratelimit-policy", `"api";q=5;w=10`)
	}
	trailer, err := s.call(t, echoUnary)
	st := wantCode(t, "call 6", err, codes.ResourceExhausted)
	if !strings.Contains(st.Message(), `grpclimit: rate limited by policy "api"; retry in 10 s`) {
		t.Errorf("call 6: message %q, want it to quote grpclimit's", st.Message())
	}
	wantTrailer(t, trailer, "ratelimit", `"api";r=0;t=10`)

	_, err = s.call(t, otherUnary)
	st = wantCode(t, "call of a method with a concurrency policy", err, codes.ResourceExhausted)
	if !strings.Contains(st.Message(), `grpclimit: Limit cannot hold the lease of concurrency policy "calls"`) {
		t.Errorf("concurrency call: message %q, want it to say that Limit cannot hold a lease", st.Message())
	}
}
