package rlqs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
)

// bigReport is a report naming n buckets no matcher matches, each id
// with a value of 200 bytes: its answer (n ALLOW_ALL actions echoing the
// ids) is about n × 220 bytes.
func bigReport(domain string, n, round int) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: domain}
	pad := strings.Repeat("v", 190)
	for i := range n {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:    &rlqspb.BucketId{Bucket: map[string]string{"unmatched": fmt.Sprintf("%s-%d-%04d", pad, round, i)}},
			TimeElapsed: durationpb.New(time.Second)})
	}
	return m
}

// TestSlowStreamIsEnded: a client that never reads. Its stream's flow
// control window is 64 KiB (set, so gRPC does not grow it) and the
// server's write quota 64 KiB: the first answer of ~220 KB is queued, the
// second Send blocks for good. A round more than a round after that send
// began ends the stream (ResourceExhausted), and the handler returns
// though its writer is still blocked in Send: returning is what unblocks
// it (gRPC then ends the stream).
func TestSlowStreamIsEnded(t *testing.T) {
	sends := make(chan struct{}, 16)
	h := newHarness(t, testConfig(), Options{sending: func() { sends <- struct{}{} }})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := s.Send(bigReport("edge", 1000, i)); err != nil {
			t.Fatal(err)
		}
		<-sends // the writer began sending the answer: the second never completes
	}
	h.clock.advance(2 * time.Second)
	h.round()
	<-h.left // the handler returned, its stream's shares freed
	for {
		if _, err = s.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too slow") {
		t.Fatalf("the slow stream ended with %v, want ResourceExhausted naming it too slow", err)
	}
}

// TestIdleBucketIsAbandoned: a stream that reports a bucket with nothing
// allowed or denied 3 times in a row hears abandon_action for it, and its
// share goes to the other stream once the abandon has surely arrived: at
// the round after the next (TestAbandonKeepsCommittedUntilApplied).
func TestIdleBucketIsAbandoned(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	a, b := h.client("edge"), h.client("edge")
	for range 3 {
		a.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		h.round()
	}
	b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	before, _ := tokens(t, b.action(tenantA))
	for i := range 3 {
		a.report(usage{id: tenantA, elapsed: 5 * time.Second})
		abandoned := a.action(tenantA).GetAbandonAction() != nil
		if abandoned != (i == 2) {
			t.Fatalf("idle report %d: abandon_action %v, want it at the third only", i+1, abandoned)
		}
	}
	if vs := h.svc.Buckets(0); len(vs) != 1 || vs[0].Streams != 1 {
		t.Fatalf("after the abandon, Buckets = %+v: want the bucket held by one stream", vs)
	}
	h.round()
	h.round()
	b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	after, _ := tokens(t, b.action(tenantA))
	if before > 50 || after < 90 {
		t.Fatalf("b's share %v/s beside a, %v/s once a abandoned the bucket: want about half, then nearly all of 100/s", before, after)
	}
}

// TestSwapChangesPoliciesAndLetsGo: after a Swap, a bucket whose matcher
// names another policy is split by it at the next round, and a bucket no
// matcher matches any more is let go: ALLOW_ALL at the next report, no
// state kept.
func TestSwapChangesPoliciesAndLetsGo(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 10, elapsed: time.Second})
	h.round()
	small := perTenant
	small.ID, small.Limit, small.Burst = "small", 10, 10
	cfg := testConfig()
	cfg.Domains[0].Matchers[0].Policy = small
	if err := h.svc.Swap(cfg); err != nil {
		t.Fatal(err)
	}
	h.round()
	c.report(usage{id: tenantA, allowed: 10, elapsed: time.Second})
	if rate, burst := tokens(t, c.action(tenantA)); rate > 10 || burst > 10 || rate < 9 {
		t.Fatalf("after a Swap to 10/s: %v/s max %d, want 15/16 of 10/s and of 10", rate, burst)
	}
	cfg.Domains[0].Matchers[0].Match = map[string]string{"tenant": "*", "route": "other"}
	if err := h.svc.Swap(cfg); err != nil {
		t.Fatal(err)
	}
	h.round()
	c.report(usage{id: tenantA, allowed: 10, elapsed: time.Second})
	if r := c.action(tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(); r != typepb.RateLimitStrategy_ALLOW_ALL {
		t.Fatalf("after a Swap no matcher matches: %v, want ALLOW_ALL", c.action(tenantA))
	}
	if vs := h.svc.Buckets(0); len(vs) != 0 {
		t.Fatalf("after a Swap no matcher matches: Buckets = %+v, want none", vs)
	}
}

// TestDomainCapIsOverflowWithoutState: past max_buckets_per_domain, a
// bucket new to the domain gets the overflow answer (the policy over the
// domain's streams, here 2), whichever stream reports it, and no state.
func TestDomainCapIsOverflowWithoutState(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBucketsPerDomain = 2
	h := newHarness(t, cfg, Options{})
	a, b := h.client("edge"), h.client("edge")
	id := func(i int) map[string]string { return map[string]string{"tenant": fmt.Sprint(i), "route": "api"} }
	a.report(usage{id: id(0), allowed: 1, elapsed: time.Second}, usage{id: id(1), allowed: 1, elapsed: time.Second})
	for i := 2; i < 20; i++ {
		b.report(usage{id: id(i), allowed: 1, elapsed: time.Second})
		if rate, burst := tokens(t, b.action(id(i))); rate != 50 || burst != 50 {
			t.Fatalf("bucket %d past the domain's cap of 2: %v/s max %d, want the policy over 2 streams: 50/s, 50", i, rate, burst)
		}
	}
	b.report(usage{id: id(0), allowed: 1, elapsed: time.Second})
	if rate, _ := tokens(t, b.action(id(0))); rate == 50 {
		t.Fatalf("a bucket the domain holds answered with the overflow share, want its own split")
	}
	if n := len(h.svc.Buckets(0)); n != 2 {
		t.Fatalf("%d buckets kept, want the cap, 2", n)
	}
}

// sizes wraps a ledger, recording the number of claims of every call.
type sizes struct {
	ledger.Ledger
	mu    sync.Mutex
	calls []int
}

func (z *sizes) Claim(ctx context.Context, domain, instance string, cs []ledger.Claim, ttl time.Duration) ([]ledger.Grant, error) {
	z.mu.Lock()
	z.calls = append(z.calls, len(cs))
	z.mu.Unlock()
	return z.Ledger.Claim(ctx, domain, instance, cs, ttl)
}

// TestClaimsGoInCallsOfAtMostMaxClaims: a domain's 2500 buckets are
// claimed in calls of at most ledger.MaxClaims, at a stream's first
// report of them and at a round, and every bucket is answered.
func TestClaimsGoInCallsOfAtMostMaxClaims(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBucketsPerStream = 3000
	h := newHarness(t, cfg, Options{})
	z := &sizes{Ledger: ledger.NewMemory(h.clock.Now)}
	h.svc.ledger = z
	c := h.client("edge")
	us := make([]usage, 2500)
	for i := range us {
		us[i] = usage{id: map[string]string{"tenant": fmt.Sprint(i), "route": "api"}, allowed: 1, elapsed: time.Second}
	}
	c.report(us...)
	h.round()
	var total int
	for _, n := range z.calls {
		if n > ledger.MaxClaims {
			t.Fatalf("a ledger call of %d claims, want at most %d", n, ledger.MaxClaims)
		}
		total += n
	}
	if total != 2*2500 {
		t.Fatalf("ledger calls of %v claims: want 2500 claimed at the first report and 2500 at the round", z.calls)
	}
	for _, u := range us {
		if c.action(u.id).GetQuotaAssignmentAction() == nil {
			t.Fatalf("a bucket of the 2500 was not answered")
		}
	}
}
