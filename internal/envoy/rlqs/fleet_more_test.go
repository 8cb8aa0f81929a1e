package rlqs_test

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// ratePerSecond is the tokens per second of p's bucket now (0 without a
// token bucket).
func ratePerSecond(p *envoyrlqs.Proxy) float64 {
	tb := p.State(tenantA).Strategy.GetTokenBucket()
	if tb == nil || tb.GetFillInterval().GetSeconds() == 0 {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

// TestFleetStreamCloses: of 4 proxies with equal demand, one closes its
// stream (its Envoy goes away); within the same report period — no
// virtual time passes, no report is sent — the server's next rounds give
// its share to the other three, which then hold what the four held
// (less one token a second each, the encoding's rounding down).
func TestFleetStreamCloses(t *testing.T) {
	ctx := guard(t, 2*time.Minute)
	sv := startServe(t, fleetConfig("", 1000, 10000))
	s := &sim{t: t, ctx: ctx, servers: []*servetest.Process{sv},
		proxies: dialFleet(t, 4, func(int) string { return sv.RLSAddr() }, nil)}
	s.run(skewed("even", 4, -1, 15*time.Second))
	var before float64
	was := make([]float64, len(s.proxies))
	for i, p := range s.proxies {
		was[i] = ratePerSecond(p)
		before += was[i]
	}
	gone, rest := s.proxies[3], s.proxies[:3]
	share := was[3]
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	// The pushes of the next rounds, with no virtual time passing: until
	// the 3 hold what the 4 did (a proxy already at its share among 3
	// gets no push, so wait on the sum, not on each).
	var after float64
	for {
		after = 0
		for _, p := range rest {
			after += ratePerSecond(p)
		}
		if after >= before-3 {
			break
		}
		if err := awaitRounds(ctx, sv, 1); err != nil {
			t.Fatalf("the 3 proxies hold %v tokens/s, the closed proxy's %v not regiven (the 4 held %v): %v", after, share, before, err)
		}
	}
	t.Logf("4 proxies held %.0f tokens/s (the closed one %.0f); after its close the other 3 hold %.0f, at virtual %v (no report since)", before, share, after, s.now)
	if after < before-3 {
		t.Errorf("after the close the 3 proxies hold %.0f tokens/s, want the 4's %.0f less at most 3", after, before)
	}
	s.proxies = rest
	s.run(skewed("even", 3, -1, 10*time.Second))
	assertBound(t, "close", append(rest, gone), s.now)
}

// TestFleetTwoInstancesSIGTERM: two `sluice serve` on one Redis, two
// proxies on each, under skewed demand: within the bound. Then one gets
// SIGTERM: its proxies hear TTL 0 (their assignments expire to the
// fallback of docs/rlqs.md, r/n and b/n for n proxies, 30 s), reconnect
// to the survivor at their next report (Redirect, as Envoy through its
// cluster), and the survivor reassigns: the fleet, fallbacks counted
// (F), stays within the bound throughout.
func TestFleetTwoInstancesSIGTERM(t *testing.T) {
	ctx := guard(t, 3*time.Minute)
	rd := redistest.Standalone(t)
	cfg := fleetConfig(fmt.Sprintf(`store: { type: redis, redis: { url: "redis://%s/0" } }`, rd.Addr), 1000, 10000)
	a, b := startServe(t, cfg), startServe(t, cfg)
	const n = 4
	fallback := &envoyrlqs.Expired{Fallback: envoyrlqs.TokenBucket(fleetBurst/n, fleetRate/n, time.Second), Timeout: 30 * time.Second}
	ps := dialFleet(t, n, func(i int) string {
		if i%2 == 0 {
			return a.RLSAddr()
		}
		return b.RLSAddr()
	}, fallback)
	s := &sim{t: t, ctx: ctx, servers: []*servetest.Process{a, b}, proxies: ps}
	s.run(skewed("90% at proxy 1 (on the second)", n, 1, 20*time.Second))
	if err := b.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.servers, s.ended = []*servetest.Process{a}, true
	for _, i := range []int{1, 3} {
		p := ps[i]
		st, err := p.AwaitState(ctx, tenantA, func(st envoyrlqs.State) bool { return st.Phase != envoyrlqs.Assignment })
		if err != nil {
			t.Fatalf("proxy %d of the stopped instance never heard TTL 0: %v\n%v", i, err, p.Events())
		}
		if st.Phase != envoyrlqs.Fallback {
			t.Fatalf("proxy %d after SIGTERM: %+v, want its fallback", i, st)
		}
	}
	select {
	case <-b.Exited():
	case <-ctx.Done():
		t.Fatalf("the SIGTERMed instance did not exit: %v", ctx.Err())
	}
	if err := b.Err(); err != nil {
		t.Fatalf("the SIGTERMed instance exited with %v\n%s", err, b.Logs())
	}
	for _, i := range []int{1, 3} {
		if err := ps[i].Redirect(a.RLSAddr()); err != nil {
			t.Fatal(err)
		}
	}
	s.run(skewed("90% at proxy 3 (moved to the survivor)", n, 3, 30*time.Second))
	for i, p := range ps {
		if st := p.State(tenantA); st.Phase != envoyrlqs.Assignment {
			t.Errorf("proxy %d at the end: %+v, want an assignment of the survivor", i, st)
		}
	}
	assertBound(t, "two instances, one SIGTERMed", ps, s.now)
	from, to := s.now-10*time.Second, s.now
	got := float64(admitted(ps, from, to))
	t.Logf("after the move, [%v, %v): the fleet admits %.0f = %.1f%% of r·T", from, to, got, 100*got/(fleetRate*(to-from).Seconds()))
	logShares(t, ps)
}

// rss is the resident set of process pid, as /proc/PID/status says it
// ("" where there is no /proc).
func rss(pid int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestFleet100kBuckets: one stream reports 100 000 distinct bucket ids, in
// reports of max_buckets_per_stream (1000) each. The server keeps 1000
// buckets (sluice_rlqs_buckets), answers the first 1000 with a share of
// their own and every other with the documented overflow answer (the
// policy split equally over the domain's S = 1 stream: 400 a second,
// burst 400; counted in sluice_rlqs_overflow_total). The process's RSS
// before and after is logged, not asserted.
func TestFleet100kBuckets(t *testing.T) {
	const ids, perReport = 100_000, 1000
	ctx := guard(t, 3*time.Minute)
	sv := startServe(t, fleetConfig("", perReport, 10000))
	rssBefore := rss(sv.PID())
	conn, err := grpc.NewClient(sv.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	answered := map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{}
	for r := range ids / perReport {
		msg := &rlqspb.RateLimitQuotaUsageReports{Domain: "edge"}
		for i := range perReport {
			msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:           &rlqspb.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("t%06d", r*perReport+i)}},
				TimeElapsed:        durationpb.New(0),
				NumRequestsAllowed: 1,
			})
		}
		if err := st.Send(msg); err != nil {
			t.Fatalf("report %d: %v", r, err)
		}
		// Each report's answers before the next: the stream's order.
		for len(answered) < (r+1)*perReport {
			resp, err := st.Recv()
			if err != nil {
				t.Fatalf("after report %d, %d buckets answered: %v", r, len(answered), err)
			}
			for _, a := range resp.GetBucketAction() {
				answered[a.GetBucketId().GetBucket()["tenant"]] = a
			}
		}
	}
	var own, overflow int
	for tenant, a := range answered {
		qa := a.GetQuotaAssignmentAction()
		tb := qa.GetRateLimitStrategy().GetTokenBucket()
		switch {
		case tb.GetMaxTokens() == fleetBurst && tb.GetTokensPerFill().GetValue() == fleetRate && tb.GetFillInterval().AsDuration() == time.Second:
			overflow++
		case tb != nil && tenant < fmt.Sprintf("t%06d", perReport):
			own++
		default:
			t.Errorf("bucket %s answered %v, want its own share (the first %d) or the overflow answer", tenant, a, perReport)
		}
		if qa.GetAssignmentTimeToLive().AsDuration() != 3*period {
			t.Errorf("bucket %s: TTL %v, want %v", tenant, qa.GetAssignmentTimeToLive().AsDuration(), 3*period)
		}
	}
	if own != perReport || overflow != ids-perReport {
		t.Errorf("%d buckets with a share of their own and %d with the overflow answer, want %d and %d", own, overflow, perReport, ids-perReport)
	}
	if err := awaitRounds(ctx, sv, 2); err != nil {
		t.Fatal(err)
	}
	kept, err := metric(ctx, sv, "sluice_rlqs_buckets")
	if err != nil {
		t.Fatal(err)
	}
	counted, err := metric(ctx, sv, "sluice_rlqs_overflow_total")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bucket ids from one stream: %.0f kept, %.0f overflow answers counted; RSS %s before, %s after", ids, kept, counted, rssBefore, rss(sv.PID()))
	if kept > perReport {
		t.Errorf("sluice_rlqs_buckets = %.0f, want at most max_buckets_per_stream %d", kept, perReport)
	}
	if counted != ids-perReport {
		t.Errorf("sluice_rlqs_overflow_total = %.0f, want %d", counted, ids-perReport)
	}
	_ = st.CloseSend()
}
