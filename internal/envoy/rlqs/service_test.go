package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
	"github.com/sluicehq/sluice/subject"
)

// perTenant is 100 a second, burst 100.
var perTenant = sluice.Policy{ID: "per-tenant", Algorithm: sluice.TokenBucket, Limit: 100, Window: time.Second, Burst: 100}

func testConfig() Config {
	return Config{Domains: []Domain{{Name: "edge", Matchers: []Matcher{{Match: map[string]string{"tenant": "*", "route": "api"}, Policy: perTenant}}}}}
}

// harness is a Service on a real gRPC server on loopback, with its
// rounds run by the test.
type harness struct {
	t     *testing.T
	svc   *Service
	clock *fakeClock
	conn  *grpc.ClientConn
	addr  string
	left  chan struct{}
}

func newHarness(t *testing.T, cfg Config, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, clock: &fakeClock{t: time.Unix(1_800_000_000, 0)}, left: make(chan struct{}, 16)}
	opts.Pseudonymizer, opts.Clock, opts.manual = subject.Unkeyed(), h.clock, true
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.left = func() { h.left <- struct{}{} }
	svc, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	h.svc = svc
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	g := grpc.NewServer()
	svc.Register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	h.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close() })
	return h
}

func (h *harness) round() { h.svc.round(context.Background()) }

// advance waits until every answer put so far was sent, then advances the
// clock by d: a round at the new time must not take a send still under
// way in real time for one stuck since the old time.
func (h *harness) advance(d time.Duration) {
	h.svc.mu.Lock()
	sts := make([]*stream, 0, len(h.svc.all))
	for st := range h.svc.all {
		sts = append(sts, st)
	}
	h.svc.mu.Unlock()
	for _, st := range sts {
		st.out.flush(context.Background())
	}
	h.clock.advance(d)
}

// client is a raw RLQS client: one stream, a reader keeping the latest
// action of every bucket, and a probe (an unmatched bucket) in every
// report, so that the report's answer is known when it arrives.
type client struct {
	t      *testing.T
	s      rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	domain string
	sent   bool
	probe  int
	msgs   chan *rlqspb.RateLimitQuotaResponse
	errc   chan error
	latest map[string]*rlqspb.RateLimitQuotaResponse_BucketAction
}

func (h *harness) client(domain string) *client {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	s, err := rlqspb.NewRateLimitQuotaServiceClient(h.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	c := &client{t: h.t, s: s, domain: domain, msgs: make(chan *rlqspb.RateLimitQuotaResponse, 1000), errc: make(chan error, 1),
		latest: map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{}}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				c.errc <- err
				return
			}
			c.msgs <- m
		}
	}()
	return c
}

// usage is one bucket's report.
type usage struct {
	id              map[string]string
	allowed, denied uint64
	elapsed         time.Duration
}

func (c *client) send(us ...usage) error {
	m := &rlqspb.RateLimitQuotaUsageReports{}
	if !c.sent {
		m.Domain, c.sent = c.domain, true
	}
	for _, u := range us {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: u.id}, NumRequestsAllowed: u.allowed, NumRequestsDenied: u.denied, TimeElapsed: durationpb.New(u.elapsed)})
	}
	return c.s.Send(m)
}

// report sends us and a probe, and returns the answer (the message
// carrying the probe): the action of each bucket is then c.latest's.
func (c *client) report(us ...usage) *rlqspb.RateLimitQuotaResponse {
	c.t.Helper()
	c.probe++
	probe := map[string]string{"probe": fmt.Sprint(c.probe)}
	if err := c.send(append(us, usage{id: probe})...); err != nil {
		c.t.Fatal(err)
	}
	key := identity(probe)
	for {
		m := c.next()
		if c.latest[key] != nil {
			return m
		}
	}
}

// next waits for the next message and records its actions.
func (c *client) next() *rlqspb.RateLimitQuotaResponse {
	c.t.Helper()
	var m *rlqspb.RateLimitQuotaResponse
	select {
	case m = <-c.msgs:
	case err := <-c.errc:
		select { // the reader queued every message before the end
		case m = <-c.msgs:
			c.errc <- err
		default:
			c.t.Fatalf("the stream ended: %v", err)
		}
	}
	for _, a := range m.GetBucketAction() {
		c.latest[identity(a.GetBucketId().GetBucket())] = a
	}
	return m
}

// action is the latest action for id.
func (c *client) action(id map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return c.latest[identity(id)]
}

// tokens is the token bucket of a, as (tokens per second, as Envoy reads
// it: per whole second of fill_interval, max tokens), or fails the test.
func tokens(t *testing.T, a *rlqspb.RateLimitQuotaResponse_BucketAction) (perSecond float64, maxTokens uint32) {
	t.Helper()
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		t.Fatalf("action %v: want a token bucket", a)
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds()), tb.GetMaxTokens()
}

var tenantA = map[string]string{"tenant": "a", "route": "api"}

func TestFirstReportAnsweredAtOnce(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 3, elapsed: 0})
	a := c.action(tenantA)
	rate, burst := tokens(t, a)
	// Alone on the bucket: a floor, 1/8 of 100/s and of 100 (25 tokens
	// every 2 s; the burst rounded down).
	if rate != 12.5 || burst != 12 {
		t.Fatalf("first answer: %v/s, max %d, want the floor 12.5/s, max 12", rate, burst)
	}
	if got := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); got != 15*time.Second {
		t.Fatalf("first answer's TTL %v, want 15s (3 × the 5 s period Envoy reports at)", got)
	}
}

func TestSkewedDemandGetsSkewedShares(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	a, b := h.client("edge"), h.client("edge")
	for range 4 {
		a.report(usage{id: tenantA, allowed: 450, denied: 450, elapsed: 5 * time.Second})
		b.report(usage{id: tenantA, allowed: 100, elapsed: 5 * time.Second})
		h.round()
		h.advance(time.Second)
	}
	a.report(usage{id: tenantA, allowed: 450, denied: 450, elapsed: 5 * time.Second})
	b.report(usage{id: tenantA, allowed: 100, elapsed: 5 * time.Second})
	ra, ba := tokens(t, a.action(tenantA))
	rb, bb := tokens(t, b.action(tenantA))
	if ra+rb > 100 || ba+bb > 100 {
		t.Fatalf("shares %v/s max %d and %v/s max %d sum above the policy's 100/s, 100", ra, ba, rb, bb)
	}
	if ra < 5*rb || ra+rb < 85 {
		t.Fatalf("shares %v/s and %v/s for demand 9:1: want skewed toward the first, near the policy", ra, rb)
	}
}

func TestClosedStreamsShareGoesToTheOther(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	a, b := h.client("edge"), h.client("edge")
	for range 3 {
		a.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
		h.round()
	}
	b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	before, _ := tokens(t, b.action(tenantA))
	if err := a.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	<-h.left
	h.round() // the ledger frees a's reservation; b's increase waits on it
	h.round()
	b.report(usage{id: tenantA, allowed: 500, elapsed: 5 * time.Second})
	after, _ := tokens(t, b.action(tenantA))
	if before > 50 || after < 90 {
		t.Fatalf("b's share %v/s beside a, %v/s once a left: want about half, then nearly all of 100/s", before, after)
	}
}

func TestUnmatchedIsAllowAll(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	for _, domain := range []string{"edge", "unknown"} {
		c := h.client(domain)
		id := map[string]string{"tenant": "a", "route": "other"}
		c.report(usage{id: id, allowed: 1, elapsed: time.Second})
		if r := c.action(id).GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(); r != typepb.RateLimitStrategy_ALLOW_ALL {
			t.Fatalf("domain %s: unmatched bucket answered %v, want ALLOW_ALL", domain, c.action(id))
		}
	}
	if n := len(h.svc.Buckets(0)); n != 0 {
		t.Fatalf("%d buckets kept for unmatched ids, want 0", n)
	}
}

func TestOverflowIsAnEqualSplitWithoutState(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBucketsPerStream = 2
	h := newHarness(t, cfg, Options{})
	c := h.client("edge")
	for i := range 50 {
		id := map[string]string{"tenant": fmt.Sprint(i), "route": "api"}
		c.report(usage{id: id, allowed: 1, elapsed: time.Second})
		if i < 2 {
			continue
		}
		if rate, burst := tokens(t, c.action(id)); rate != 100 || burst != 100 {
			t.Fatalf("bucket %d past the cap of 2: %v/s max %d, want the policy over 1 stream: 100/s, 100", i, rate, burst)
		}
	}
	if n := len(h.svc.Buckets(0)); n != 2 {
		t.Fatalf("%d buckets kept, want the cap, 2", n)
	}
}

// TestReportPastTheCapIsAnswered: Envoy reports every bucket it caches
// in one message, so a report of more buckets than the per-stream cap is
// answered, the ones past the cap with the overflow answer, and the
// stream goes on (refused, the stream would end at every report).
func TestReportPastTheCapIsAnswered(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBucketsPerStream = 2
	h := newHarness(t, cfg, Options{})
	c := h.client("edge")
	var us []usage
	for i := range 50 {
		us = append(us, usage{id: map[string]string{"tenant": fmt.Sprint(i), "route": "api"}, allowed: 1, elapsed: time.Second})
	}
	c.report(us...)
	for i, u := range us[2:] {
		if rate, burst := tokens(t, c.action(u.id)); rate != 100 || burst != 100 {
			t.Fatalf("bucket %d past the cap of 2: %v/s max %d, want the overflow answer: 100/s, 100", i+2, rate, burst)
		}
	}
	c.report(us[0])
	if n := len(h.svc.Buckets(0)); n != 2 {
		t.Fatalf("%d buckets kept, want the cap, 2", n)
	}
}

// releases wraps the memory ledger, counting releases.
type releases struct {
	ledger.Ledger
	mu sync.Mutex
	n  int
}

func (r *releases) Release(ctx context.Context, domain, instance string) error {
	r.mu.Lock()
	r.n++
	r.mu.Unlock()
	return r.Ledger.Release(ctx, domain, instance)
}

// now is an Options.after that has waited already.
func now(time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

func TestShutdownSendsTTLZero(t *testing.T) {
	h := newHarness(t, testConfig(), Options{after: now})
	rel := &releases{Ledger: ledger.NewMemory(h.clock.Now)}
	h.svc.ledger = rel
	a, b := h.client("edge"), h.client("edge")
	ids := []map[string]string{tenantA, {"tenant": "b", "route": "api"}}
	for _, c := range []*client{a, b} {
		c.report(usage{id: ids[0], allowed: 1, elapsed: time.Second}, usage{id: ids[1], allowed: 1, elapsed: time.Second})
	}
	h.round()
	done := make(chan struct{})
	go func() { h.svc.Shutdown(context.Background()); close(done) }()
	for _, c := range []*client{a, b} {
		for _, id := range ids {
			for a := c.action(id); a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != 0; a = c.action(id) {
				c.next()
			}
		}
	}
	<-done
	for _, c := range []*client{a, b} {
		if err := <-c.errc; !errors.Is(err, io.EOF) {
			t.Fatalf("after Shutdown the stream ended with %v, want its end (EOF)", err)
		}
	}
	if rel.n != 1 {
		t.Fatalf("%d ledger releases, want 1 (one domain)", rel.n)
	}
}

// TestShutdownReleasesARoundAfterTTLZero: the ledger entries are
// released one round after the TTL 0 answers were sent, so that they are
// applied (delivery within a round, the bound's assumption 1) before
// the reservation goes; and not at all when Shutdown's ctx ends first
// (the entries then expire by themselves, which is safe).
func TestShutdownReleasesARoundAfterTTLZero(t *testing.T) {
	for _, cut := range []bool{false, true} {
		asked, fire := make(chan time.Duration, 1), make(chan time.Time)
		h := newHarness(t, testConfig(), Options{after: func(d time.Duration) <-chan time.Time { asked <- d; return fire }})
		rel := &releases{Ledger: ledger.NewMemory(h.clock.Now)}
		h.svc.ledger = rel
		c := h.client("edge")
		c.report(usage{id: tenantA, allowed: 1, elapsed: time.Second})
		h.round()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { h.svc.Shutdown(ctx); close(done) }()
		select {
		case d := <-asked:
			if d != time.Second {
				t.Fatalf("Shutdown waited %v after TTL 0, want a round, 1s", d)
			}
		case <-done:
			t.Fatalf("Shutdown returned (%d releases) without waiting a round after TTL 0", rel.n)
		}
		for a := c.action(tenantA); a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != 0; a = c.action(tenantA) {
			c.next()
		}
		rel.mu.Lock()
		early := rel.n
		rel.mu.Unlock()
		if early != 0 {
			t.Fatalf("%d releases before the round after TTL 0 passed, want 0", early)
		}
		if cut {
			cancel()
		} else {
			fire <- time.Time{}
		}
		<-done
		cancel()
		if want := map[bool]int{false: 1, true: 0}[cut]; rel.n != want {
			t.Fatalf("ctx cut %v: %d releases, want %d", cut, rel.n, want)
		}
	}
}

func TestPlanChangesABucketsNumbers(t *testing.T) {
	var mu sync.Mutex
	var plans []sluice.Override
	h := newHarness(t, testConfig(), Options{Overrides: func(context.Context) ([]sluice.Override, error) {
		mu.Lock()
		defer mu.Unlock()
		return plans, nil
	}})
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 10, elapsed: time.Second})
	vs := h.svc.Buckets(0)
	if len(vs) != 1 {
		t.Fatalf("Buckets = %+v, want 1", vs)
	}
	mu.Lock()
	plans = []sluice.Override{{Policy: "per-tenant", Subject: vs[0].Subject, Limit: 10}}
	mu.Unlock()
	h.round()
	c.report(usage{id: tenantA, allowed: 10, elapsed: time.Second})
	// Alone with demand: 15/16 of the plan's 10/s and 10 (75 tokens every
	// 8 s; the burst rounded down).
	if rate, burst := tokens(t, c.action(tenantA)); rate != 9.375 || burst != 9 {
		t.Fatalf("under a plan of 10/s: %v/s max %d, want 9.375/s max 9", rate, burst)
	}
}

func TestBadInputIsInvalidArgument(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	long := strings.Repeat("x", 257)
	many := map[string]string{}
	for i := range 33 {
		many[fmt.Sprint("k", i)] = "v"
	}
	rows := []struct {
		name, domain string
		u            usage
		want         string
	}{
		{"no domain", "", usage{id: tenantA}, "domain: empty"},
		{"33 entries", "edge", usage{id: many}, "bucket_quota_usages[0].bucket_id.bucket: 33 entries: must have 1 to 32"},
		{"a value of 257 bytes", "edge", usage{id: map[string]string{"tenant": long}}, "keys and values must have at most 256"},
		{"no entries", "edge", usage{id: nil}, "bucket_quota_usages[0].bucket_id.bucket: 0 entries"},
	}
	for _, r := range rows {
		c := h.client(r.domain)
		if err := c.send(r.u); err != nil {
			t.Fatal(err)
		}
		err := <-c.errc
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s: the stream ended with %v, want InvalidArgument naming %q", r.name, err, r.want)
		}
		if strings.Contains(err.Error(), long) {
			t.Errorf("%s: the error repeats the value", r.name)
		}
	}
}

func TestMetricsRegister(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, testConfig(), Options{Metrics: m})
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 7, denied: 2, elapsed: time.Second})
	h.round()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			got[f.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	for name, want := range map[string]float64{"sluice_rlqs_reported_allowed_total": 7, "sluice_rlqs_reported_denied_total": 2,
		"sluice_rlqs_buckets": 1, "sluice_rlqs_streams": 1, "sluice_rlqs_rounds_total": 1, "sluice_rlqs_ledger_calls_total": 2} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}

// failing is a ledger whose calls fail while down is set.
type failing struct {
	ledger.Ledger
	mu   sync.Mutex
	down bool
}

func (f *failing) Claim(ctx context.Context, domain, instance string, cs []ledger.Claim, ttl time.Duration) ([]ledger.Grant, error) {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		return nil, errors.New("ledger down")
	}
	return f.Ledger.Claim(ctx, domain, instance, cs, ttl)
}

func TestLedgerOutageKeepsAssignmentsUntilTheirTTL(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	f := &failing{Ledger: ledger.NewMemory(h.clock.Now)}
	h.svc.ledger = f
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	h.round()
	c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	before, _ := tokens(t, c.action(tenantA))
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	h.advance(10 * time.Second)
	h.round()
	m := c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	if len(m.GetBucketAction()) != 2 {
		t.Fatalf("10 s into an outage (TTL 15 s) the answer has %d actions, want the bucket's and the probe's", len(m.GetBucketAction()))
	}
	if during, _ := tokens(t, c.action(tenantA)); during != before {
		t.Fatalf("during the outage the share moved from %v/s to %v/s, want kept", before, during)
	}
	h.advance(10 * time.Second)
	h.round()
	m = c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	if len(m.GetBucketAction()) != 1 {
		t.Fatalf("past the TTL the answer has %d actions, want only the probe's: the assignment left to expire", len(m.GetBucketAction()))
	}
}

// TestOutageRefreshEndsWithTheLedgerEntry: during a ledger outage a
// report's answer refreshes the assignment only up to when this
// instance's ledger entry may expire (the last claim's send time + its
// entry TTL, 15 s + 1 round): an assignment that outlived its entry would
// be in force while another instance may be granted its share.
func TestOutageRefreshEndsWithTheLedgerEntry(t *testing.T) {
	h := newHarness(t, testConfig(), Options{})
	f := &failing{Ledger: ledger.NewMemory(h.clock.Now)}
	h.svc.ledger = f
	c := h.client("edge")
	c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
	claimed := h.clock.Now()
	h.round() // the last claim: its entry lives 15 s + 1 s (the round)
	entryEnds := claimed.Add(16 * time.Second)
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	for _, step := range []time.Duration{time.Second, 5 * time.Second, 4*time.Second + 500*time.Millisecond, 5 * time.Second} {
		h.advance(step)
		h.round()
		c.report(usage{id: tenantA, allowed: 50, elapsed: 5 * time.Second})
		a := c.action(tenantA).GetQuotaAssignmentAction()
		if ends := h.clock.Now().Add(a.GetAssignmentTimeToLive().AsDuration()); ends.After(entryEnds) {
			t.Fatalf("%v into the outage: the answer's TTL %v ends %v after the ledger entry may expire",
				h.clock.Now().Sub(claimed), a.GetAssignmentTimeToLive().AsDuration(), ends.Sub(entryEnds))
		}
	}
}
