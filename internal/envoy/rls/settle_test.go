package rls_test

import (
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// settleRules: 1 000 tokens an hour per API key, each request's tokens
// known only once its stream is done; and a rule that does not settle.
const settleRules = `
domain: ai
descriptors:
  - key: api_key
    rate_limit: { unit: hour, requests_per_unit: 1000, sluice_settle: true }
  - key: model
    rate_limit: { unit: hour, requests_per_unit: 10 }
`

// llm plays Envoy's two calls of one LLM request: the request-time call
// (its rate_limits entry's hits_addend the estimate) and the stream-done
// call (apply_on_stream_done, hits_addend from the response's dynamic
// metadata, and the generic_key marking it).
type llm struct {
	t *testing.T
	h *harness
}

// call sends one descriptor of key, then the request id (when not ""),
// then the stream-done marker when done, with hits (nil: none).
func (l llm) call(key, requestID string, done bool, hits *wrapperspb.UInt64Value) st {
	l.t.Helper()
	kv := []string{"api_key", key}
	if requestID != "" {
		kv = append(kv, "sluice_request_id", requestID)
	}
	if done {
		kv = append([]string{"sluice_stream_done", "true"}, kv...) // anywhere in the descriptor
	}
	desc := d(kv...)
	desc.HitsAddend = hits
	_, got, _ := l.h.ask(l.t, &rlspb.RateLimitRequest{Domain: "ai", Descriptors: []*commonpb.RateLimitDescriptor{desc}})
	return got[0]
}

func (l llm) estimate(key, id string, n uint64) st {
	return l.call(key, id, false, wrapperspb.UInt64(n))
}
func (l llm) done(key, id string, n uint64) st { return l.call(key, id, true, wrapperspb.UInt64(n)) }

// left is what key has left: a check (hits_addend 0) without a request id.
func (l llm) left(key string) uint32 {
	l.t.Helper()
	return l.call(key, "", false, wrapperspb.UInt64(0)).Remaining
}

// testSettle: the request-time call spends the estimate, the stream-done
// call settles it at the actual cost (given back, or charged past the
// limit), a retried stream-done call changes nothing, and what cannot be
// settled is answered OK, changes nothing more and is counted by reason.
func testSettle(t *testing.T, h *harness, clock *sluicetest.Clock) {
	l := llm{t, h}
	const limit = "1000/HOUR"
	steps := []struct {
		name string
		key  string
		call func() st
		want st
		left uint32 // what key has left after it
	}{
		{"estimate 300", "k1", func() st { return l.estimate("k1", "r1", 300) }, st{"OK", limit, 700}, 700},
		{"settle at 120: 180 given back", "k1", func() st { return l.done("k1", "r1", 120) }, st{"OK", limit, 880}, 880},
		{"the stream-done call retried, another cost", "k1", func() st { return l.done("k1", "r1", 999) }, st{"OK", limit, 880}, 880},
		{"estimate 300 again, its own request id", "k1", func() st { return l.estimate("k1", "r2", 300) }, st{"OK", limit, 580}, 580},
		{"settle at 900: 600 charged, 20 past the limit", "k1", func() st { return l.done("k1", "r2", 900) }, st{"OK", limit, 0}, 0},
		{"the next estimate is denied", "k1", func() st { return l.estimate("k1", "r3", 1) }, st{"OVER_LIMIT", limit, 0}, 0},
		{"its stream-done call: no estimate to settle", "k1", func() st { return l.done("k1", "r3", 50) }, st{"OK", limit, 0}, 0},
		{"another key: a budget of its own", "k2", func() st { return l.estimate("k2", "r1", 100) }, st{"OK", limit, 900}, 900},
		{"no request id: a plain spend", "k2", func() st { return l.estimate("k2", "", 100) }, st{"OK", limit, 800}, 800},
		{"stream done without a request id: nothing", "k2", func() st { return l.done("k2", "", 10) }, st{"OK", limit, 0}, 800},
		{"stream done without a cost: nothing", "k2", func() st { return l.call("k2", "r1", true, nil) }, st{"OK", limit, 0}, 800},
		{"stream done, the cost 0: all given back", "k2", func() st { return l.done("k2", "r1", 0) }, st{"OK", limit, 900}, 900},
		{"stream done of a request never sent", "k2", func() st { return l.done("k2", "r9", 7) }, st{"OK", limit, 0}, 900},
		{"a long stream: estimate 500", "k3", func() st { return l.estimate("k3", "r1", 500) }, st{"OK", limit, 500}, 500},
		{"its stream done 50 minutes later: remembered", "k3", func() st { clock.Advance(50 * time.Minute); return l.done("k3", "r1", 100) }, st{"OK", limit, 900}, 900},
	}
	for _, s := range steps {
		if got := s.call(); got != s.want {
			t.Errorf("%s: status = %+v, want %+v", s.name, got, s.want)
		}
		if left := l.left(s.key); left != s.left {
			t.Errorf("%s: %s has %d left, want %d", s.name, s.key, left, s.left)
		}
	}
	for reason, want := range map[string]float64{"no_request_id": 2, "no_cost": 1, "no_estimate": 2} {
		if got := sumLabel(t, h.reg, "sluice_envoy_unsettled_total", "reason", reason); got != want {
			t.Errorf("sluice_envoy_unsettled_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "settled"); n != 5 {
		t.Errorf("settled descriptors = %v, want 5 (the retry included)", n)
	}
}

// testStreamDoneOtherRule: the stream-done marker on a rule that does not
// settle changes nothing: the descriptor is decided as without it.
func testStreamDoneOtherRule(t *testing.T, h *harness, _ *sluicetest.Clock) {
	desc := d("model", "m", "sluice_stream_done", "true")
	desc.HitsAddend = wrapperspb.UInt64(4)
	_, got, _ := h.ask(t, &rlspb.RateLimitRequest{Domain: "ai", Descriptors: []*commonpb.RateLimitDescriptor{desc}})
	if want := (st{"OK", "10/HOUR", 6}); len(got) != 1 || got[0] != want {
		t.Errorf("stream done on a rule that does not settle = %+v, want %+v (spent as without the marker)", got, want)
	}
	// A limit override never settles: its stream-done call spends nothing.
	over := func(done bool, hits uint64) st {
		kv := []string{"api_key", "k9", "sluice_request_id", "r1"}
		if done {
			kv = append(kv, "sluice_stream_done", "true")
		}
		desc := d(kv...)
		desc.HitsAddend = wrapperspb.UInt64(hits)
		desc.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typepb.RateLimitUnit_HOUR}
		_, got, _ := h.ask(t, &rlspb.RateLimitRequest{Domain: "ai", Descriptors: []*commonpb.RateLimitDescriptor{desc}})
		return got[0]
	}
	if got, want := over(false, 30), (st{"OK", "100/HOUR", 70}); got != want {
		t.Errorf("request time with a limit override = %+v, want %+v (a plain spend)", got, want)
	}
	if got, want := over(true, 50), (st{"OK", "100/HOUR", 0}); got != want {
		t.Errorf("stream done with a limit override = %+v, want %+v (nothing)", got, want)
	}
	if got, want := over(false, 0), (st{"OK", "100/HOUR", 70}); got != want {
		t.Errorf("after the stream-done call with a limit override = %+v, want %+v (nothing spent)", got, want)
	}
	if n := sumLabel(t, h.reg, "sluice_envoy_unsettled_total", "reason", "limit_override"); n != 1 {
		t.Errorf("sluice_envoy_unsettled_total{reason=limit_override} = %v, want 1", n)
	}
	twice := d("api_key", "k", "sluice_request_id", "a", "sluice_request_id", "b")
	if _, err := h.client.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "ai", Descriptors: []*commonpb.RateLimitDescriptor{twice}}); err == nil {
		t.Errorf("two request ids in one descriptor were decided, want InvalidArgument")
	}
}

func TestSettleMemstore(t *testing.T) {
	for _, fn := range []func(*testing.T, *harness, *sluicetest.Clock){testSettle, testStreamDoneOtherRule} {
		clock := sluicetest.NewClock()
		ms, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		fn(t, start(t, ms, settleRules), clock)
	}
}

func TestSettleRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, fn := range []func(*testing.T, *harness, *sluicetest.Clock){testSettle, testStreamDoneOtherRule} {
		clock := sluicetest.NewClock()
		fn(t, start(t, redisStore(t, srv, clock), settleRules), clock)
	}
}

// sumLabel adds up the series of name whose label is value.
func sumLabel(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == label && l.GetValue() == value {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// TestSettleUnavailable: with Redis stopped, the stream-done call is
// answered OK (Envoy ignores its answer; the estimate stays spent),
// counted unavailable, where the request-time call of the fail-closed
// rule fails UNAVAILABLE as any spend.
func TestSettleUnavailable(t *testing.T) {
	srv := redistest.Standalone(t)
	h := start(t, redisStore(t, srv, sluicetest.NewClock()), settleRules)
	l := llm{t, h}
	if got := l.estimate("k1", "r1", 300); got != (st{"OK", "1000/HOUR", 700}) {
		t.Fatalf("estimate 300 = %+v, want OK with 700 left", got)
	}
	srv.Stop()
	if got := l.done("k1", "r1", 100); got != (st{"OK", "1000/HOUR", 0}) {
		t.Errorf("stream done, Redis stopped = %+v, want OK", got)
	}
	if n := sumLabel(t, h.reg, "sluice_envoy_unsettled_total", "reason", "unavailable"); n != 1 {
		t.Errorf("sluice_envoy_unsettled_total{reason=unavailable} = %v, want 1", n)
	}
	desc := d("api_key", "k1", "sluice_request_id", "r2")
	desc.HitsAddend = wrapperspb.UInt64(10)
	if _, err := h.client.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "ai", Descriptors: []*commonpb.RateLimitDescriptor{desc}}); status.Code(err) != codes.Unavailable {
		t.Errorf("estimate, Redis stopped = %v, want UNAVAILABLE (the rule fails closed)", err)
	}
}

// TestSettleConcurrentRedis: 40 streams of one key at once on Redis,
// each estimating 100 of 1 000 and settling at its own actual cost (0 to
// 110); a denied estimate's stream-done call settles nothing. Whatever
// the order, the key is left with exactly the limit minus the actual
// costs of the admitted streams: each estimate was replaced by its cost
// once, and nothing else was spent.
func TestSettleConcurrentRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	h := start(t, redisStore(t, srv, sluicetest.NewClock()), settleRules)
	l := llm{t, h}
	const streams = 40
	var mu sync.Mutex
	var admitted, spent int64
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, actual := "c"+strconv.Itoa(i), uint64(i*110/(streams-1))
			ok := l.estimate("kc", id, 100).Code == "OK"
			if got := l.done("kc", id, actual); got.Code != "OK" {
				t.Errorf("stream %d: stream-done call = %+v, want OK", i, got)
			}
			if ok {
				mu.Lock()
				admitted, spent = admitted+1, spent+int64(actual)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// While at most 8 are admitted, they hold at most 8 × 110 units
	// (estimated or settled), so a ninth estimate always fits.
	if admitted < 9 {
		t.Fatalf("%d of %d estimates admitted, want at least 9", admitted, streams)
	}
	if left, want := int64(l.left("kc")), max(1000-spent, 0); left != want {
		t.Errorf("left after %d admitted streams that cost %d = %d, want %d", admitted, spent, left, want)
	}
	if n := sumLabel(t, h.reg, "sluice_envoy_unsettled_total", "reason", "no_estimate"); n != float64(streams-admitted) {
		t.Errorf("unsettled no_estimate = %v, want the %d denied", n, streams-admitted)
	}
}

// settled records the outcomes of the settles a Core takes.
type settled struct {
	mu  sync.Mutex
	got []sluice.Outcome
}

func (s *settled) count(_, _ []string, o sluice.Outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, o)
}

// last returns the outcome of the last settle taken, and how many were.
func (s *settled) last() (sluice.Outcome, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) == 0 {
		return sluice.Outcome{}, 0
	}
	return s.got[len(s.got)-1], len(s.got)
}

// startSettling serves settleRules over store with a Core that records
// every settle it takes.
func startSettling(t *testing.T, store sluice.Store) (*harness, *settled) {
	t.Helper()
	rec := &settled{}
	h := startWith(t, store, settleRules, func(st *rls.State) {
		core, err := edge.New(st.Limiter, edge.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Prefix: "rls", Settled: rec.count})
		if err != nil {
			t.Fatal(err)
		}
		st.Core = core
	})
	return h, rec
}

// testSettleAboveCapacity: a stream-done call whose cost is above the
// rule's capacity (1 000 an hour) is a settle like any other, never a
// denial answered before the store: the store charges it up to its debt
// bound (a fixed window counts at most twice its limit), as the check
// API's settle of the same numbers does, and it is answered OK. A cost
// above what the store takes at all (algorithm.MaxLimit) is that most.
func testSettleAboveCapacity(t *testing.T, store sluice.Store) {
	h, rec := startSettling(t, store)
	l := llm{t, h}
	const limit = "1000/HOUR"
	type charge struct{ charged, owed int64 }
	steps := []struct {
		name string
		key  string
		call func() st
		want st
		left uint32
		// settled is what the settle charged and left owed; nil when the
		// step takes no settle.
		settled *charge
	}{
		{"estimate 100", "k1", func() st { return l.estimate("k1", "r1", 100) }, st{"OK", limit, 900}, 900, nil},
		{"stream done at 1001: 901 charged, 1 owed", "k1", func() st { return l.done("k1", "r1", 1001) }, st{"OK", limit, 0}, 0, &charge{901, 1}},
		{"the stream-done call retried: nothing more", "k1", func() st { return l.done("k1", "r1", 1001) }, st{"OK", limit, 0}, 0, &charge{901, 1}},
		{"the next estimate is denied", "k1", func() st { return l.estimate("k1", "r2", 1) }, st{"OVER_LIMIT", limit, 0}, 0, nil},
		{"estimate 100 on another key", "k2", func() st { return l.estimate("k2", "r1", 100) }, st{"OK", limit, 900}, 900, nil},
		{"stream done at 2^40: the debt bound, 1900 charged", "k2", func() st { return l.done("k2", "r1", 1<<40) }, st{"OK", limit, 0}, 0, &charge{1900, 1000}},
	}
	for _, s := range steps {
		_, before := rec.last()
		if got := s.call(); got != s.want {
			t.Errorf("%s: status = %+v, want %+v", s.name, got, s.want)
		}
		if left := l.left(s.key); left != s.left {
			t.Errorf("%s: %s has %d left, want %d", s.name, s.key, left, s.left)
		}
		o, after := rec.last()
		switch {
		case s.settled == nil && after != before:
			t.Errorf("%s: a settle was taken, want none", s.name)
		case s.settled != nil && after != before+1:
			t.Errorf("%s: %d settles taken, want 1", s.name, after-before)
		case s.settled != nil && (o.Kind != sluice.Allowed || o.Charged != s.settled.charged || o.Owed != s.settled.owed):
			t.Errorf("%s: settle = %v, charged %d, owed %d; want allowed, charged %d, owed %d", s.name, o.Kind, o.Charged, o.Owed, s.settled.charged, s.settled.owed)
		}
	}
	if n := sumLabel(t, h.reg, "sluice_envoy_unsettled_total", "rule", "ai.api_key"); n != 0 {
		t.Errorf("sluice_envoy_unsettled_total = %v, want 0: every settle was taken", n)
	}
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "settled"); n != 3 {
		t.Errorf("settled descriptors = %v, want 3 (the retry included)", n)
	}
}

func TestSettleAboveCapacityMemstore(t *testing.T) { testSettleAboveCapacity(t, memStore(t)) }

func TestSettleAboveCapacityRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	testSettleAboveCapacity(t, redisStore(t, srv, sluicetest.NewClock()))
}
