package rls_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// testRules is the rules file of these tests, in envoyproxy/ratelimit's
// format. Both stores run on a fake clock (sluicetest.NewClock, at a
// UTC midnight), so windows aligned to the clock roll over only when a
// test moves it.
const testRules = `
domain: shop
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: api
    rate_limit: { unit: day, requests_per_unit: 5 }
  - key: path
    value: "/search*"
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: path
    value: /search/special
    rate_limit: { unit: hour, requests_per_unit: 4 }
  - key: internal
    rate_limit: { unlimited: true }
  - key: remote_address
    value: 50.0.0.5
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: { name: specific_limit, unit: hour, requests_per_unit: 2 }
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit:
          replaces: [{ name: specific_limit }]
          unit: hour
          requests_per_unit: 4
  - key: closed
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: open
    rate_limit: { unit: hour, requests_per_unit: 5, failure_mode: open }
`

type harness struct {
	client rlspb.RateLimitServiceClient
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	svc    *rls.Service
	store  sluice.Store
}

// start serves the rules over store on a real loopback socket.
func start(t *testing.T, store sluice.Store, yaml string) *harness {
	t.Helper()
	return startWith(t, store, yaml, nil)
}

// startWith is start with the State changed by adjust (unless nil).
func startWith(t *testing.T, store sluice.Store, yaml string, adjust func(*rls.State)) *harness {
	t.Helper()
	cfg, err := rules.Parse([]rules.Source{{Name: "shop.yaml", Data: []byte(yaml)}})
	if err != nil {
		t.Fatalf("rules.Parse: %v", err)
	}
	lim, err := sluice.New(store, cfg.Policies(), sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := rls.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	state := &rls.State{Rules: cfg, Limiter: lim, Store: store, Pseudonymizer: subject.Unkeyed()}
	if adjust != nil {
		adjust(state)
	}
	svc, err := rls.New(state, rls.Options{Logger: log, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		<-done
	})
	return &harness{client: rlspb.NewRateLimitServiceClient(conn), conn: conn, reg: reg, svc: svc, store: store}
}

func memHarness(t *testing.T) *harness { return start(t, memStore(t), testRules) }

// memStore is a memstore on a fake clock, closed when t ends.
func memStore(t *testing.T) *memstore.Store {
	t.Helper()
	ms, err := memstore.New(memstore.Options{Clock: sluicetest.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	return ms
}

func redisHarness(t *testing.T) (*harness, *redistest.Server) {
	srv := redistest.Standalone(t)
	return start(t, redisStore(t, srv, sluicetest.NewClock()), testRules), srv
}

// redisStore is a Redis store on srv deciding on clock, the caller's.
// No test here hangs Redis, so its round trips are bounded by the
// caller's deadline alone (askTimeout), not the store's default 1s: under
// the race detector on a loaded machine a round trip that loads the code
// took longer, and a check wanted OK was answered UNAVAILABLE.
func redisStore(t *testing.T, srv *redistest.Server, clock *sluicetest.Clock) *redisstore.Store {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: askTimeout, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	st, err := redisstore.New(c, redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// d builds a descriptor from key, value pairs.
func d(kv ...string) *commonpb.RateLimitDescriptor {
	var es []*commonpb.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &commonpb.RateLimitDescriptor{Entries: es}
}

// st is a descriptor status in short: code, limit ("1/HOUR", "" for
// none) and remaining.
type st struct {
	Code      string
	Limit     string
	Remaining uint32
}

// askTimeout bounds a call on a loaded machine: a bound, not a threshold.
const askTimeout = 30 * time.Second

func (h *harness) ask(t *testing.T, req *rlspb.RateLimitRequest) (string, []st, *rlspb.RateLimitResponse) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	resp, err := h.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	var got []st
	for _, s := range resp.Statuses {
		x := st{Code: s.Code.String(), Remaining: s.LimitRemaining}
		if l := s.CurrentLimit; l != nil {
			x.Limit = strings.TrimSpace(strings.Join([]string{itoa(l.RequestsPerUnit), l.Unit.String()}, "/"))
		}
		got = append(got, x)
	}
	return resp.OverallCode.String(), got, resp
}

func itoa(n uint32) string {
	var b []byte
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func req(descs ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "shop", Descriptors: descs}
}

// step is one request and the answer it must get.
type step struct {
	name    string
	req     *rlspb.RateLimitRequest
	overall string
	want    []st
}

func run(t *testing.T, h *harness, steps []step) {
	t.Helper()
	for _, s := range steps {
		overall, got, _ := h.ask(t, s.req)
		if overall != s.overall || !cmp.Equal(got, s.want) {
			t.Fatalf("%s: ShouldRateLimit = %s %+v, want %s %+v", s.name, overall, got, s.overall, s.want)
		}
	}
}

func testSecondDescriptorOverLimit(t *testing.T, h *harness) {
	// Two subjects: the first descriptor is spent, the second is over.
	r := req(d("api", "k1"), d("path", "/search/q"))
	run(t, h, []step{
		{"first", r, "OK", []st{{"OK", "5/DAY", 4}, {"OK", "2/HOUR", 1}}},
		{"second", r, "OK", []st{{"OK", "5/DAY", 3}, {"OK", "2/HOUR", 0}}},
		{"third", r, "OVER_LIMIT", []st{{"OK", "5/DAY", 2}, {"OVER_LIMIT", "2/HOUR", 0}}},
	})
	_, _, resp := h.ask(t, r)
	if resp.Statuses[1].DurationUntilReset.AsDuration() <= 0 {
		t.Errorf("over-limit status has duration_until_reset %v, want > 0", resp.Statuses[1].DurationUntilReset.AsDuration())
	}
	hdr := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		hdr[hv.Key] = hv.Value
	}
	if p := hdr["RateLimit-Policy"]; !strings.Contains(p, `"shop.api";q=5;w=86400`) || !strings.Contains(p, ";q=2;w=3600") {
		t.Errorf("RateLimit-Policy = %q, want both policies", p)
	}
	if l := hdr["RateLimit"]; !strings.HasPrefix(l, `"shop.path_-search-`) || !strings.Contains(l, ";r=0;t=") {
		t.Errorf("RateLimit = %q, want the over-limit policy first with r=0", l)
	}
	if hdr["Retry-After"] == "" {
		t.Errorf("over-limit answer lacks Retry-After: %v", hdr)
	}
}

func testSameSubjectAtomic(t *testing.T, h *harness) {
	// Both descriptors fix nothing but the user: one subject, decided
	// all or nothing.
	both := req(d("user", "u1"), d("plan", "free", "user", "u1"))
	run(t, h, []step{
		{"first", both, "OK", []st{{"OK", "10/HOUR", 9}, {"OK", "1/HOUR", 0}}},
		{"second: nothing spent on the first", both, "OVER_LIMIT", []st{{"OK", "10/HOUR", 9}, {"OVER_LIMIT", "1/HOUR", 0}}},
		{"user alone", req(d("user", "u1")), "OK", []st{{"OK", "10/HOUR", 8}}},
		{"another user", req(d("user", "u2"), d("plan", "free", "user", "u2")), "OK", []st{{"OK", "10/HOUR", 9}, {"OK", "1/HOUR", 0}}},
	})
}

func testDuplicate(t *testing.T, h *harness) {
	twice := req(d("api", "dup"), d("api", "dup"))
	run(t, h, []step{
		{"a descriptor twice is counted once", twice, "OK", []st{{"OK", "5/DAY", 4}, {"OK", "5/DAY", 4}}},
		{"again", twice, "OK", []st{{"OK", "5/DAY", 3}, {"OK", "5/DAY", 3}}},
		{"with another cost it is another check", &rlspb.RateLimitRequest{Domain: "shop", HitsAddend: 1, Descriptors: []*commonpb.RateLimitDescriptor{d("api", "dup"), {Entries: d("api", "dup").Entries, HitsAddend: wrapperspb.UInt64(2)}}}, "OK", []st{{"OK", "5/DAY", 2}, {"OK", "5/DAY", 0}}},
	})
}

func testHitsAddend(t *testing.T, h *harness) {
	r := req(d("api", "h"))
	r.HitsAddend = 3
	r2 := req(d("api", "h"))
	r2.Descriptors[0].HitsAddend = wrapperspb.UInt64(2) // overrides the request's
	r2.HitsAddend = 4
	r3 := req(d("api", "h2"))
	r3.HitsAddend = 6
	run(t, h, []step{
		{"hits_addend 3", r, "OK", []st{{"OK", "5/DAY", 2}}},
		{"descriptor hits_addend 2", r2, "OK", []st{{"OK", "5/DAY", 0}}},
		{"one more", req(d("api", "h")), "OVER_LIMIT", []st{{"OVER_LIMIT", "5/DAY", 0}}},
		{"more than the limit", r3, "OVER_LIMIT", []st{{"OVER_LIMIT", "5/DAY", 0}}},
		{"nothing was spent", req(d("api", "h2")), "OK", []st{{"OK", "5/DAY", 4}}},
	})
}

// testHitsAddendZero: a descriptor's hits_addend of 0 checks without
// spending (a peek: OVER_LIMIT when the next unit would be denied).
// Descriptors of one subject that ask for different costs are decided
// one cost at a time, checks first; once one is denied, the rest of that
// subject only check.
func testHitsAddendZero(t *testing.T, h *harness) {
	check := req(d("api", "z"))
	check.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	check.HitsAddend = 3 // the descriptor's 0 wins
	five := req(d("api", "z"))
	five.HitsAddend = 5
	peekUser := func(user string, cost uint64) *rlspb.RateLimitRequest {
		r := req(d("user", user), d("plan", "free", "user", user))
		r.Descriptors[0].HitsAddend = wrapperspb.UInt64(cost)
		return r
	}
	planFirst := req(d("plan", "free", "user", "m2"), d("user", "m2"))
	planFirst.Descriptors[1].HitsAddend = wrapperspb.UInt64(3)
	run(t, h, []step{
		{"check: nothing spent", check, "OK", []st{{"OK", "5/DAY", 5}}},
		{"check again", check, "OK", []st{{"OK", "5/DAY", 5}}},
		{"spend 5", five, "OK", []st{{"OK", "5/DAY", 0}}},
		{"check: the next unit would be denied", check, "OVER_LIMIT", []st{{"OVER_LIMIT", "5/DAY", 0}}},
		{"a check beside a spend of one subject", peekUser("m1", 0), "OK", []st{{"OK", "10/HOUR", 10}, {"OK", "1/HOUR", 0}}},
		{"the spend is over; the check still spends nothing", peekUser("m1", 0), "OVER_LIMIT", []st{{"OK", "10/HOUR", 10}, {"OVER_LIMIT", "1/HOUR", 0}}},
		{"costs 3 and 1: one evaluation each", peekUser("m2", 3), "OK", []st{{"OK", "10/HOUR", 7}, {"OK", "1/HOUR", 0}}},
		{"costs 3 and 1 again: the 3 was spent before the 1 was denied", peekUser("m2", 3), "OVER_LIMIT", []st{{"OK", "10/HOUR", 4}, {"OVER_LIMIT", "1/HOUR", 0}}},
		{"the denied one first: the 3 is then only checked", planFirst, "OVER_LIMIT", []st{{"OVER_LIMIT", "1/HOUR", 0}, {"OK", "10/HOUR", 4}}},
		{"nothing was spent", req(d("user", "m2")), "OK", []st{{"OK", "10/HOUR", 3}}},
	})
	// One check denied by its second policy: the subject's next check,
	// of another cost, spends nothing either.
	three := req(d("user", "m3"), d("plan", "free", "user", "m3"), d("key_1", "value_1", "user", "m3"))
	three.Descriptors[2].HitsAddend = wrapperspb.UInt64(2)
	run(t, h, []step{
		{"the plan's one", req(d("plan", "free", "user", "m3")), "OK", []st{{"OK", "1/HOUR", 0}}},
		{"user and plan denied by the plan; key_1's 2 only checked", three, "OVER_LIMIT", []st{{"OK", "10/HOUR", 10}, {"OVER_LIMIT", "1/HOUR", 0}, {"OK", "2/HOUR", 2}}},
		{"key_1 was not spent", req(d("key_1", "value_1", "user", "m3")), "OK", []st{{"OK", "2/HOUR", 1}}},
	})
}

// testLimitOverride: a descriptor's limit replaces the rule's numbers for
// that request, on a counter of its own for each set of numbers.
func testLimitOverride(t *testing.T, h *harness) {
	over := func(rpu uint32, unit typepb.RateLimitUnit, descs ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitRequest {
		r := req(descs...)
		for _, d := range r.Descriptors {
			d.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
		}
		return r
	}
	thirty := over(2, typepb.RateLimitUnit_SECOND, d("api", "o30"))
	thirty.Descriptors[0].Limit.UnitMultiplier = wrapperspb.UInt32(30)
	run(t, h, []step{
		{"2 a minute in place of 5 a day", over(2, typepb.RateLimitUnit_MINUTE, d("api", "o1")), "OK", []st{{"OK", "2/MINUTE", 1}}},
		{"2 a minute: second", over(2, typepb.RateLimitUnit_MINUTE, d("api", "o1")), "OK", []st{{"OK", "2/MINUTE", 0}}},
		{"2 a minute: over", over(2, typepb.RateLimitUnit_MINUTE, d("api", "o1")), "OVER_LIMIT", []st{{"OVER_LIMIT", "2/MINUTE", 0}}},
		{"the rule's counter was not touched", req(d("api", "o1")), "OK", []st{{"OK", "5/DAY", 4}}},
		{"other numbers, another counter", over(3, typepb.RateLimitUnit_MINUTE, d("api", "o1")), "OK", []st{{"OK", "3/MINUTE", 2}}},
		{"no rule matches: the override applies", over(1, typepb.RateLimitUnit_HOUR, d("nope", "x")), "OK", []st{{"OK", "1/HOUR", 0}}},
		{"no rule matches: over", over(1, typepb.RateLimitUnit_HOUR, d("nope", "x")), "OVER_LIMIT", []st{{"OVER_LIMIT", "1/HOUR", 0}}},
		{"an override is never shadow", over(1, typepb.RateLimitUnit_HOUR, d("service", "s", "user", "user-a")), "OK", []st{{"OK", "1/HOUR", 0}}},
		{"an override is never shadow: over", over(1, typepb.RateLimitUnit_HOUR, d("service", "s", "user", "user-a")), "OVER_LIMIT", []st{{"OVER_LIMIT", "1/HOUR", 0}}},
		{"0 denies without the store", over(0, typepb.RateLimitUnit_MINUTE, d("api", "o2")), "OVER_LIMIT", []st{{"OVER_LIMIT", "0/MINUTE", 0}}},
		{"unit_multiplier: 2 per 30s", thirty, "OK", []st{{"OK", "2/SECOND", 1}}},
		{"a month, their fixed 30 days", over(1, typepb.RateLimitUnit_MONTH, d("api", "m")), "OK", []st{{"OK", "1/MONTH", 0}}},
		{"a month: over", over(1, typepb.RateLimitUnit_MONTH, d("api", "m")), "OVER_LIMIT", []st{{"OVER_LIMIT", "1/MONTH", 0}}},
		{"unknown domain: no limit", &rlspb.RateLimitRequest{Domain: "other", Descriptors: over(1, typepb.RateLimitUnit_HOUR, d("api", "x")).Descriptors}, "OK", []st{{"OK", "", 0}}},
	})
	_, _, resp := h.ask(t, thirty)
	if r := resp.Statuses[0].GetDurationUntilReset().AsDuration(); r != 30*time.Second {
		t.Errorf("2 per 30s: duration_until_reset = %v, want 30s (the clock stands at a boundary)", r)
	}
	if _, err := h.client.ShouldRateLimit(context.Background(), over(1, typepb.RateLimitUnit_UNKNOWN, d("api", "w"))); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors[0].limit.unit") {
		t.Errorf("override unit UNKNOWN: %v, want InvalidArgument naming descriptors[0].limit.unit", err)
	}
	twoYears := over(1, typepb.RateLimitUnit_YEAR, d("api", "y2"))
	twoYears.Descriptors[0].Limit.UnitMultiplier = wrapperspb.UInt32(2)
	if _, err := h.client.ShouldRateLimit(context.Background(), twoYears); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "365 days") {
		t.Errorf("override of 2 years: %v, want InvalidArgument naming the 365 days bound", err)
	}
	if n := sumRule(t, h.reg, rls.OverrideRule); n == 0 {
		t.Errorf("no descriptor counted under rule %q", rls.OverrideRule)
	}
}

// sumRule adds up sluice_envoy_descriptors_total's series of rule.
func sumRule(t *testing.T, reg *prometheus.Registry, rule string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "sluice_envoy_descriptors_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "rule" && l.GetValue() == rule {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func testRefund(t *testing.T, h *harness) {
	spend := req(d("api", "r"))
	spend.HitsAddend = 4
	back := req(d("api", "r"))
	back.Descriptors[0].IsNegativeHits = true
	back.Descriptors[0].HitsAddend = wrapperspb.UInt64(9) // more than the limit: gives back all
	run(t, h, []step{
		{"spend 4", spend, "OK", []st{{"OK", "5/DAY", 1}}},
		{"give back", back, "OK", []st{{"OK", "5/DAY", 5}}},
		{"spend 1", req(d("api", "r")), "OK", []st{{"OK", "5/DAY", 4}}},
	})
}

func testMatching(t *testing.T, h *harness) {
	run(t, h, []step{
		{"wildcard", req(d("path", "/search/a")), "OK", []st{{"OK", "2/HOUR", 1}}},
		{"wildcard, another value is another subject", req(d("path", "/search/b")), "OK", []st{{"OK", "2/HOUR", 1}}},
		{"exact beats wildcard", req(d("path", "/search/special")), "OK", []st{{"OK", "4/HOUR", 3}}},
		{"wildcard miss", req(d("path", "/home")), "OK", []st{{"OK", "", 0}}},
		{"nested", req(d("plan", "free", "user", "n1")), "OK", []st{{"OK", "1/HOUR", 0}}},
		{"placeholder alone", req(d("plan", "free")), "OK", []st{{"OK", "", 0}}},
		{"deeper than the rules", req(d("user", "n1", "extra", "x")), "OK", []st{{"OK", "", 0}}},
		{"unlimited", req(d("internal", "x")), "OK", []st{{"OK", "", math.MaxUint32}}},
		{"blocked value", req(d("remote_address", "50.0.0.5")), "OVER_LIMIT", []st{{"OVER_LIMIT", "0/SECOND", 0}}},
		{"unknown descriptor", req(d("nope", "x")), "OK", []st{{"OK", "", 0}}},
		{"unknown domain", &rlspb.RateLimitRequest{Domain: "other", Descriptors: []*commonpb.RateLimitDescriptor{d("user", "u")}}, "OK", []st{{"OK", "", 0}}},
	})
}

// testShadow: a shadow rule is decided and counted, answered OK, and its
// answer carries the fields an enforced one would (never Retry-After:
// the request goes through).
func testShadow(t *testing.T, h *harness) {
	r := req(d("service", "s", "user", "user-a"))
	run(t, h, []step{
		{"first", r, "OK", []st{{"OK", "1/HOUR", 0}}},
		{"over, but shadow", r, "OK", []st{{"OK", "1/HOUR", 0}}},
	})
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "shadow_over_limit"); n != 1 {
		t.Errorf("shadow_over_limit count = %v, want 1", n)
	}
	_, _, resp := h.ask(t, r)
	hdr := headerMap(resp)
	if p := hdr["RateLimit-Policy"]; !strings.Contains(p, ";q=1;w=3600") {
		t.Errorf("shadow answer: RateLimit-Policy = %q, want the shadow rule's q=1;w=3600 (all fields: %v)", p, hdr)
	}
	if l := hdr["RateLimit"]; !strings.Contains(l, ";r=0;t=") {
		t.Errorf("shadow answer over the limit: RateLimit = %q, want r=0", l)
	}
	if ra, ok := hdr["Retry-After"]; ok {
		t.Errorf("shadow answer: Retry-After = %q, want none (the request is admitted)", ra)
	}
	// Beside an enforced rule that is over, Retry-After is the enforced
	// rule's, not the shadow rule's longer wait.
	both := req(d("service", "s", "user", "user-a"), d("remote_address", "50.0.0.5"))
	_, _, resp = h.ask(t, both)
	if hdr := headerMap(resp); resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || hdr["RateLimit-Policy"] == "" {
		t.Errorf("shadow beside a blocked address: %v, fields %v; want OVER_LIMIT with the shadow rule's fields", resp.OverallCode, hdr)
	}
}

// headerMap returns resp's response_headers_to_add by name.
func headerMap(resp *rlspb.RateLimitResponse) map[string]string {
	hdr := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		hdr[hv.Key] = hv.Value
	}
	return hdr
}

func testReplaces(t *testing.T, h *harness) {
	noRule := sum(t, h.reg, "sluice_envoy_descriptors_total", "no_rule")
	replaced := sum(t, h.reg, "sluice_envoy_descriptors_total", "replaced")
	under := sumRule(t, h.reg, "shop.key_1_value_1.user")
	both := req(d("key_1", "value_1", "user", "bk"), d("key_2", "value_2", "user", "bk"))
	run(t, h, []step{
		{"1", both, "OK", []st{{"OK", "", 0}, {"OK", "4/HOUR", 3}}},
		{"2", both, "OK", []st{{"OK", "", 0}, {"OK", "4/HOUR", 2}}},
		{"3", both, "OK", []st{{"OK", "", 0}, {"OK", "4/HOUR", 1}}},
		{"the replaced limit was not spent", req(d("key_1", "value_1", "user", "bk")), "OK", []st{{"OK", "2/HOUR", 1}}},
	})
	// A replaced descriptor matched a rule: counted as replaced, under
	// that rule, never as no rule.
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "no_rule") - noRule; n != 0 {
		t.Errorf("no_rule count rose by %v after replaced descriptors only, want 0", n)
	}
	if n := sumRule(t, h.reg, "shop.key_1_value_1.user") - under; n != 4 {
		t.Errorf("descriptors counted under the replaced rule rose by %v, want 4 (3 replaced, 1 decided)", n)
	}
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "replaced") - replaced; n != 3 {
		t.Errorf("replaced count rose by %v, want 3", n)
	}
}

func testInvalid(t *testing.T, h *harness) {
	for _, r := range []*rlspb.RateLimitRequest{{Descriptors: []*commonpb.RateLimitDescriptor{d("a", "b")}}, {Domain: "shop"}} {
		_, err := h.client.ShouldRateLimit(context.Background(), r)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("ShouldRateLimit(%v) = %v, want InvalidArgument", r, err)
		}
	}
}

func testHealth(t *testing.T, h *harness) {
	hc := healthpb.NewHealthClient(h.conn)
	for _, svc := range []string{"", rls.ServiceName} {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}
	h.svc.Shutdown()
	resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rls.ServiceName})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health Check after Shutdown = %v, %v; want NOT_SERVING", resp, err)
	}
}

// sum adds up the series of name whose code label is code.
func sum(t *testing.T, reg *prometheus.Registry, name, code string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "code" && l.GetValue() == code {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

var cases = []struct {
	name string
	fn   func(*testing.T, *harness)
}{
	{"SecondDescriptorOverLimit", testSecondDescriptorOverLimit},
	{"SameSubjectAtomic", testSameSubjectAtomic},
	{"HitsAddend", testHitsAddend},
	{"HitsAddendZero", testHitsAddendZero},
	{"Duplicate", testDuplicate},
	{"LimitOverride", testLimitOverride},
	{"Refund", testRefund},
	{"Matching", testMatching},
	{"Shadow", testShadow},
	{"Replaces", testReplaces},
	{"Invalid", testInvalid},
	{"Health", testHealth},
}

func TestMemstore(t *testing.T) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, memHarness(t)) })
	}
}

func TestRedis(t *testing.T) {
	h, _ := redisHarness(t)
	// One server for all cases: every case uses subjects of its own.
	for _, c := range cases {
		if c.name == "Health" || c.name == "Shadow" {
			continue // both need a fresh service; memstore covers them
		}
		t.Run(c.name, func(t *testing.T) { c.fn(t, h) })
	}
}

// TestFailureModes stops Redis: a fail-closed rule makes the call fail
// with UNAVAILABLE, so Envoy's failure_mode_deny decides; a fail-open
// rule is answered OK.
func TestFailureModes(t *testing.T) {
	h, srv := redisHarness(t)
	run(t, h, []step{
		{"closed, Redis up", req(d("closed", "c")), "OK", []st{{"OK", "5/HOUR", 4}}},
		{"open, Redis up", req(d("open", "o")), "OK", []st{{"OK", "5/HOUR", 4}}},
	})
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	_, err := h.client.ShouldRateLimit(ctx, req(d("closed", "c")))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "fails closed") {
		t.Errorf("closed rule, Redis stopped: %v, want UNAVAILABLE", err)
	}
	_, err = h.client.ShouldRateLimit(ctx, req(d("open", "o"), d("closed", "c")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("open and closed rules, Redis stopped: %v, want UNAVAILABLE", err)
	}
	run(t, h, []step{
		{"open, Redis stopped", req(d("open", "o")), "OK", []st{{"OK", "5/HOUR", 0}}},
		{"no rule needs no store", req(d("nope", "x")), "OK", []st{{"OK", "", 0}}},
	})
	if n := sum(t, h.reg, "sluice_envoy_requests_total", "Unavailable"); n != 2 {
		t.Errorf("sluice_envoy_requests_total{code=Unavailable} = %v, want 2", n)
	}
}

// TestEveryField serves the rules package's fixture that uses every field of the
// format and sluice's additions, and checks that they behave as
// envoyproxy/ratelimit documents them.
func TestEveryField(t *testing.T) {
	data, err := os.ReadFile("../rules/testdata/valid/messaging.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, memStore(t), string(data))
	r := func(descs ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitRequest {
		return &rlspb.RateLimitRequest{Domain: "messaging", Descriptors: descs}
	}
	marketing := r(d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111"))
	run(t, h, []step{
		{"nested and key-only, one subject", marketing, "OK", []st{{"OK", "5/DAY", 4}, {"OK", "100/DAY", 99}}},
		{"detailed_metric changes nothing", r(d("to_number", "2061111111")), "OK", []st{{"OK", "100/DAY", 98}}},
		{"per address", r(d("remote_address", "50.0.0.1")), "OK", []st{{"OK", "10/SECOND", 9}}},
		{"blocked address", r(d("remote_address", "50.0.0.5")), "OVER_LIMIT", []st{{"OVER_LIMIT", "0/SECOND", 0}}},
		{"unlimited", r(d("ldap", "x")), "OK", []st{{"OK", "", math.MaxUint32}}},
		{"gcra burst 2: first", r(d("path", "/api/a")), "OK", []st{{"OK", "3/MINUTE", 1}}},
		{"gcra burst 2: second", r(d("path", "/api/a")), "OK", []st{{"OK", "3/MINUTE", 0}}},
		{"gcra burst 2: third", r(d("path", "/api/a")), "OVER_LIMIT", []st{{"OVER_LIMIT", "3/MINUTE", 0}}},
		{"shadow user-a", r(d("service", "s", "user", "user-a")), "OK", []st{{"OK", "1/HOUR", 0}}},
		{"shadow user-a over", r(d("service", "s", "user", "user-a")), "OK", []st{{"OK", "1/HOUR", 0}}},
		{"user-b enforced", r(d("service", "s", "user", "user-b")), "OK", []st{{"OK", "2/HOUR", 1}}},
		{"user-b", r(d("service", "s", "user", "user-b")), "OK", []st{{"OK", "2/HOUR", 0}}},
		{"user-b over", r(d("service", "s", "user", "user-b")), "OVER_LIMIT", []st{{"OVER_LIMIT", "2/HOUR", 0}}},
		{"replaces", r(d("key_1", "value_1", "user", "u"), d("key_2", "value_2", "user", "u")), "OK", []st{{"OK", "", 0}, {"OK", "4/HOUR", 3}}},
	})
}

// TestNoPolicies serves rules that need no store (unlimited, 0 per
// unit): no Limiter, and a limit override still counts on the store.
func TestNoPolicies(t *testing.T) {
	cfg, err := rules.Parse([]rules.Source{{Name: "open.yaml", Data: []byte(`domain: open
descriptors:
  - key: ldap
    rate_limit: { unlimited: true }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
`)}})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(&rls.State{Rules: cfg, Store: memStore(t), Pseudonymizer: subject.Unkeyed()}, rls.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := &harness{client: rlspb.NewRateLimitServiceClient(conn), conn: conn}
	r := func(descs ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitRequest {
		return &rlspb.RateLimitRequest{Domain: "open", Descriptors: descs}
	}
	limited := r(d("ldap", "x"))
	limited.Descriptors[0].Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typepb.RateLimitUnit_HOUR}
	run(t, h, []step{
		{"unlimited", r(d("ldap", "x")), "OK", []st{{"OK", "", math.MaxUint32}}},
		{"blocked", r(d("blocked", "x")), "OVER_LIMIT", []st{{"OVER_LIMIT", "0/SECOND", 0}}},
		{"an override", limited, "OK", []st{{"OK", "1/HOUR", 0}}},
		{"an override: over", limited, "OVER_LIMIT", []st{{"OVER_LIMIT", "1/HOUR", 0}}},
	})
}

// countingStore counts the decisions its Store is asked for.
type countingStore struct {
	sluice.Store
	n atomic.Int64
}

func (c *countingStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	c.n.Add(1)
	return c.Store.Evaluate(ctx, ev)
}

// TestRequestBounds: one request with 10 000 distinct descriptors made
// 10 000 sequential store calls (1.2s; 16 in parallel raised RSS from 24
// to 168 MB). A request over the bounds on descriptors, or on entries in
// one descriptor, is refused InvalidArgument naming the bound, before any
// store call; one at the bounds is decided.
func TestRequestBounds(t *testing.T) {
	cs := &countingStore{Store: memStore(t)}
	h := start(t, cs, testRules)
	many := func(n int) []*commonpb.RateLimitDescriptor {
		ds := make([]*commonpb.RateLimitDescriptor, n)
		for i := range ds {
			ds[i] = d("user", "u"+strconv.Itoa(i))
		}
		return ds
	}
	wide := d("user", "w")
	for i := range rls.DefaultMaxEntries {
		wide.Entries = append(wide.Entries, &commonpb.RateLimitDescriptor_Entry{Key: "k" + strconv.Itoa(i), Value: "v"})
	}
	for _, tc := range []struct {
		name string
		req  *rlspb.RateLimitRequest
		want string // "" for decided
	}{
		{"10000 descriptors", req(many(10000)...), "descriptors: 10000: at most " + strconv.Itoa(rls.DefaultMaxDescriptors) + " per request"},
		{"one over", req(many(rls.DefaultMaxDescriptors + 1)...), "at most " + strconv.Itoa(rls.DefaultMaxDescriptors) + " per request"},
		{"one descriptor too wide", req(d("user", "x"), wide), "descriptors[1].entries: " + strconv.Itoa(rls.DefaultMaxEntries+1) + ": at most " + strconv.Itoa(rls.DefaultMaxEntries) + " per descriptor"},
		{"at the bound", req(many(rls.DefaultMaxDescriptors)...), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := cs.n.Load()
			_, err := h.client.ShouldRateLimit(context.Background(), tc.req)
			calls := cs.n.Load() - before
			if tc.want == "" {
				if err != nil || calls == 0 {
					t.Fatalf("ShouldRateLimit = %v after %d store calls, want decided", err, calls)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) || calls != 0 {
				t.Fatalf("ShouldRateLimit = %v after %d store calls, want InvalidArgument %q and none", err, calls, tc.want)
			}
		})
	}
	h = startWith(t, cs, testRules, func(st *rls.State) { st.MaxDescriptors, st.MaxEntries = 2, 1 })
	for r, want := range map[*rlspb.RateLimitRequest]string{
		req(many(3)...):                     "descriptors: 3: at most 2 per request",
		req(d("plan", "free", "user", "x")): "descriptors[0].entries: 2: at most 1 per descriptor",
	} {
		if _, err := h.client.ShouldRateLimit(context.Background(), r); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
			t.Errorf("with bounds 2 and 1: ShouldRateLimit = %v, want InvalidArgument %q", err, want)
		}
	}
}

// TestPooledStateDoesNotLeak: the service reuses a request's working
// memory (descriptors, groups, buffers) for the next request and builds
// each answer in memory of its own. Requests of different shapes in turn
// get the answers they would get alone, and an answer already returned
// does not change while later requests are decided.
func TestPooledStateDoesNotLeak(t *testing.T) {
	h := memHarness(t)
	ctx := context.Background()
	big := req(d("user", "p1"), d("plan", "free", "user", "p1"), d("internal", "x"), d("api", "p1"), d("nope", "x"), d("api", "p1"))
	small := req(d("api", "p2"))
	short := func(resp *rlspb.RateLimitResponse) (string, []st) {
		var got []st
		for _, s := range resp.Statuses {
			x := st{Code: s.Code.String(), Remaining: s.LimitRemaining}
			if l := s.CurrentLimit; l != nil {
				x.Limit = itoa(l.RequestsPerUnit) + "/" + l.Unit.String()
			}
			got = append(got, x)
		}
		return resp.OverallCode.String(), got
	}
	var kept []*rlspb.RateLimitResponse // answers returned, with a copy taken then
	var copies []proto.Message
	steps := []step{
		{"big", big, "OK", []st{{"OK", "10/HOUR", 9}, {"OK", "1/HOUR", 0}, {"OK", "", math.MaxUint32}, {"OK", "5/DAY", 4}, {"OK", "", 0}, {"OK", "5/DAY", 4}}},
		{"small", small, "OK", []st{{"OK", "5/DAY", 4}}},
		{"big again", big, "OVER_LIMIT", []st{{"OK", "10/HOUR", 9}, {"OVER_LIMIT", "1/HOUR", 0}, {"OK", "", math.MaxUint32}, {"OK", "5/DAY", 3}, {"OK", "", 0}, {"OK", "5/DAY", 3}}},
		{"small again", small, "OK", []st{{"OK", "5/DAY", 3}}},
		{"no rule", req(d("nope", "y")), "OK", []st{{"OK", "", 0}}},
		{"small a third time", small, "OK", []st{{"OK", "5/DAY", 2}}},
	}
	for _, s := range steps {
		resp, err := h.svc.ShouldRateLimit(ctx, s.req)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if overall, got := short(resp); overall != s.overall || !cmp.Equal(got, s.want) {
			t.Fatalf("%s: ShouldRateLimit = %s %+v, want %s %+v", s.name, overall, got, s.overall, s.want)
		}
		kept, copies = append(kept, resp), append(copies, proto.Clone(resp))
	}
	for i, resp := range kept {
		if !proto.Equal(resp, copies[i]) {
			t.Errorf("%s: the answer changed after later requests:\n%v\nwas\n%v", steps[i].name, resp, copies[i])
		}
	}
	if hs := headerMap(kept[1]); hs["RateLimit-Policy"] == "" || hs["RateLimit"] == "" || len(hs) != 2 {
		t.Errorf("small: headers %v, want RateLimit-Policy and RateLimit alone", hs)
	}
	// The counters found once are the registry's: every answer counted.
	if ok, over := sum(t, h.reg, "sluice_envoy_requests_total", "OK"), sum(t, h.reg, "sluice_envoy_requests_total", "OVER_LIMIT"); ok != 5 || over != 1 {
		t.Errorf("sluice_envoy_requests_total: OK %v, OVER_LIMIT %v; want 5 and 1", ok, over)
	}
	if n := sumRule(t, h.reg, "shop.api"); n != 7 {
		t.Errorf("sluice_envoy_descriptors_total{rule=shop.api} = %v, want 7 (two in each big request, three small ones)", n)
	}
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "unlimited"); n != 2 {
		t.Errorf("sluice_envoy_descriptors_total{code=unlimited} = %v, want 2", n)
	}
}
