package grpclimit_test

import (
	"regexp"
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

// TestDenialDatesAMonthlyWait: a monthly quota's ResourceExhausted says
// when to retry as a date (RFC 3339, UTC), not as millions of seconds;
// RetryInfo keeps the wait.
func TestDenialDatesAMonthlyWait(t *testing.T) {
	clock := sluicetest.NewClock()
	clock.Set(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	ints := newInterceptors(t, clock, grpclimit.Options{Methods: []grpclimit.Method{{Name: echoUnary, Policies: []string{"monthly"}}}},
		sluice.Policy{ID: "monthly", Algorithm: sluice.FixedWindow, Limit: 1, Period: "month"})
	s := serveInterceptors(t, ints)
	_, err := s.call(t, echoUnary)
	wantCode(t, "call 1", err, codes.OK)
	_, err = s.call(t, echoUnary)
	st := wantCode(t, "call 2", err, codes.ResourceExhausted)
	dated := regexp.MustCompile(`; retry after \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`)
	if !dated.MatchString(st.Message()) {
		t.Errorf("call 2: message %q, want it to end %q", st.Message(), "; retry after <RFC 3339 date>")
	}
	if got, want := retryDelay(t, st), (21*24+12)*time.Hour; got != want {
		t.Errorf("call 2: RetryInfo %v, want %v", got, want)
	}
}
