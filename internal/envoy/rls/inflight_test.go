package rls_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// inFlightRules: at most 10 requests in flight per user, each named by
// its request id (Envoy's x-request-id), reclaimed a minute after a
// stream-done call that never came.
const inFlightRules = `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: request_id
        rate_limit:
          sluice_in_flight: { limit: 10, lease_ttl: 1m }
`

const inFlightTTL = time.Minute

// envoy plays Envoy's two calls for one stream of user: the request-time
// call (the route's rate_limits entry without apply_on_stream_done) and
// the stream-done call (the entry with apply_on_stream_done and a
// negative or zero hits_addend, as typed_per_filter_config sends it).
type envoy struct {
	t *testing.T
	h *harness
}

func (e envoy) call(user, id string, done func(*commonpb.RateLimitDescriptor)) string {
	e.t.Helper()
	desc := d("user", user, "request_id", id)
	if done != nil {
		done(desc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	resp, err := e.h.client.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{desc}})
	if err != nil {
		e.t.Errorf("ShouldRateLimit(%s, %s): %v", user, id, err)
		return "error"
	}
	return resp.OverallCode.String()
}

// request is the request-time call: it acquires the stream's lease.
func (e envoy) request(user, id string) string { return e.call(user, id, nil) }

// streamDone is the stream-done call: Envoy sends is_negative_hits with
// a hits_addend of 1, or a hits_addend of 0; negative says which.
func (e envoy) streamDone(user, id string, negative bool) string {
	return e.call(user, id, func(desc *commonpb.RateLimitDescriptor) {
		if negative {
			desc.HitsAddend, desc.IsNegativeHits = wrapperspb.UInt64(1), true
		} else {
			desc.HitsAddend = wrapperspb.UInt64(0)
		}
	})
}

// releases broadcasts each stream-done call: a stream denied waits for
// the next one before it asks again (an event, never a sleep).
type releases struct {
	mu sync.Mutex
	ch chan struct{}
}

func (r *releases) next() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

func (r *releases) happened() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.ch)
	r.ch = make(chan struct{})
}

// testInFlight: 50 concurrent streams of one user under a limit of 10 in
// flight. The first attempts of all 50 find 10 slots; those streams hold
// them until every first attempt is answered. Then every admitted stream
// ends with a stream-done call, and each denied stream asks again after
// the next stream-done call, until all 50 were served. Streams 0 to 4
// run on an Envoy that crashes: admitted, they never send the
// stream-done call, so their 5 leases stay held until the lease TTL
// passes on the store's clock. The streams admitted and not yet released
// are counted: never more than 10.
func testInFlight(t *testing.T, h *harness, clock *sluicetest.Clock) {
	e := envoy{t, h}
	const streams, limit, crashed = 50, 10, 5
	var held, most, firstOK atomic.Int64
	hold := make(chan struct{})
	rel := &releases{ch: make(chan struct{})}
	stuck, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	var first, all sync.WaitGroup
	first.Add(streams)
	all.Add(streams)
	for i := range streams {
		go func() {
			defer all.Done()
			id := "req-" + strconv.Itoa(i)
			for attempt := 0; ; attempt++ {
				if attempt == 100 {
					t.Errorf("stream %d: not admitted in 100 attempts", i)
					return
				}
				wake := rel.next() // before asking: a release meanwhile is not missed
				code := e.request("alice", id)
				if attempt == 0 {
					if code == "OK" {
						firstOK.Add(1)
					}
					first.Done()
				}
				if code != "OK" {
					select {
					case <-wake:
					case <-stuck.Done(): // a bound for a broken service, not an order
						t.Errorf("stream %d: no stream-done call for %v after a denial: the slots never came back", i, askTimeout)
						return
					}
					continue
				}
				n := held.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if attempt == 0 {
					<-hold // the first ten hold until every first attempt is answered
				}
				if i < crashed {
					return // the crashed Envoy never sends the stream-done call
				}
				held.Add(-1)
				if code := e.streamDone("alice", id, i%2 == 0); code != "OK" {
					t.Errorf("stream %d: stream-done call answered %s, want OK", i, code)
				}
				rel.happened()
				return
			}
		}()
	}
	first.Wait()
	if n := firstOK.Load(); n != limit {
		t.Errorf("first attempts of %d concurrent streams: %d admitted, want %d", streams, n, limit)
	}
	close(hold)
	all.Wait()
	if m := most.Load(); m > limit {
		t.Errorf("at most %d streams were in flight at once, want at most %d", m, limit)
	}
	if n := held.Load(); n != crashed {
		t.Fatalf("%d leases held after every stream, want the %d of the crashed Envoy", n, crashed)
	}
	// The crashed Envoy's leases hold 5 of the 10 slots until their TTL.
	for i := range limit - crashed {
		if code := e.request("alice", "after-"+strconv.Itoa(i)); code != "OK" {
			t.Fatalf("after: request %d = %s, want OK (%d slots are free)", i, code, limit-crashed)
		}
	}
	if code := e.request("alice", "after-over"); code != "OVER_LIMIT" {
		t.Fatalf("after: request %d = %s, want OVER_LIMIT (the crashed leases hold 5)", limit-crashed, code)
	}
	if code := e.request("bob", "bob-1"); code != "OK" {
		t.Errorf("another user = %s, want OK (a budget of its own)", code)
	}
	for i := range limit - crashed {
		e.streamDone("alice", "after-"+strconv.Itoa(i), true)
	}
	// A stream-done call for a request that was denied, or twice, is harmless.
	e.streamDone("alice", "after-over", false)
	e.streamDone("alice", "after-0", false)
	clock.Advance(inFlightTTL - time.Microsecond)
	if code := e.request("alice", "before-ttl"); code != "OK" {
		t.Fatalf("just before the TTL: %s, want OK (5 free)", code)
	}
	for i := range limit - crashed - 1 {
		e.request("alice", "before-ttl-"+strconv.Itoa(i))
	}
	if code := e.request("alice", "before-ttl-over"); code != "OVER_LIMIT" {
		t.Fatalf("just before the TTL: the 11th = %s, want OVER_LIMIT (the crashed leases still hold)", code)
	}
	for i := range limit - crashed - 1 {
		e.streamDone("alice", "before-ttl-"+strconv.Itoa(i), true)
	}
	e.streamDone("alice", "before-ttl", true)
	clock.Advance(time.Microsecond) // the crashed leases expire: their slots come back
	for i := range limit {
		if code := e.request("alice", "reclaimed-"+strconv.Itoa(i)); code != "OK" {
			t.Fatalf("after the TTL: request %d = %s, want OK (all 10 slots back)", i, code)
		}
	}
	if code := e.request("alice", "reclaimed-over"); code != "OVER_LIMIT" {
		t.Errorf("after the TTL: the 11th = %s, want OVER_LIMIT", code)
	}
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "released"); n < streams-crashed {
		t.Errorf("released count = %v, want at least %d", n, streams-crashed)
	}
}

func TestInFlightMemstore(t *testing.T) {
	clock := sluicetest.NewClock()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	testInFlight(t, start(t, ms, inFlightRules), clock)
}

func TestInFlightRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := sluicetest.NewClock()
	testInFlight(t, start(t, redisStore(t, srv, clock), inFlightRules), clock)
}

// TestInFlightAnswers: an in-flight descriptor's answer names the limit
// and what is left; a request-time call with an empty request id is
// refused, since every such request would share one lease.
func TestInFlightAnswers(t *testing.T) {
	h := start(t, memStore(t), inFlightRules)
	r := &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{d("user", "u", "request_id", "r1")}}
	r.HitsAddend = 7 // one slot, whatever the hits
	_, got, _ := h.ask(t, r)
	if want := (st{"OK", "10/UNKNOWN", 9}); len(got) != 1 || got[0] != want {
		t.Errorf("acquire = %+v, want %+v", got, want)
	}
	_, got, _ = h.ask(t, r)
	if want := (st{"OK", "10/UNKNOWN", 9}); len(got) != 1 || got[0] != want {
		t.Errorf("the same request id again = %+v, want %+v (one lease, renewed)", got, want)
	}
	_, err := h.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{d("user", "u", "request_id", "")}})
	if err == nil {
		t.Errorf("an empty request id was decided, want InvalidArgument")
	}
}

// TestInFlightLimitOverride: a descriptor's limit (Envoy's per-request
// override, a count per unit) on an in-flight rule is ignored: the
// in-flight rule decides, so no more streams are admitted than its
// limit, and the answer is never an error (Envoy's failure_mode_deny:
// false admits an error answer, so a refusal would let every such
// stream through). Each ignored limit is counted under the rule, and
// the stream-done call with a limit still releases its lease. Applied,
// the limit would have replaced the leases by a fixed window keyed by
// every entry, the request id among them, so that each stream got a
// budget of its own.
func TestInFlightLimitOverride(t *testing.T) {
	h := start(t, memStore(t), inFlightRules)
	withLimit := func(id string, done bool) *rlspb.RateLimitRequest {
		desc := d("user", "u", "request_id", id)
		desc.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typepb.RateLimitUnit_MINUTE}
		if done {
			desc.HitsAddend = wrapperspb.UInt64(0)
		}
		return &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{desc}}
	}
	const limit, streams = 10, 13
	admitted := 0
	for i := range streams {
		ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
		resp, err := h.client.ShouldRateLimit(ctx, withLimit("with-limit-"+strconv.Itoa(i), false))
		cancel()
		if err != nil {
			t.Fatalf("stream %d with a limit = %v; want an answer, never an error Envoy would admit", i, err)
		}
		if resp.OverallCode == rlspb.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != limit {
		t.Errorf("%d streams with a limit of 100/MINUTE on an in-flight rule of %d: %d admitted, want %d (the in-flight limit holds)", streams, limit, admitted, limit)
	}
	if code, got, _ := h.ask(t, &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{d("user", "u", "request_id", "plain")}}); code != "OVER_LIMIT" || len(got) != 1 || got[0] != (st{"OVER_LIMIT", "10/UNKNOWN", 0}) {
		t.Errorf("a plain stream with every slot held = %s %+v, want OVER_LIMIT, 10/UNKNOWN, 0 left", code, got)
	}
	if code, _, _ := h.ask(t, withLimit("with-limit-0", true)); code != "OK" {
		t.Errorf("the stream-done call of a stream, with its limit = %s, want OK", code)
	}
	if code, got, _ := h.ask(t, &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*commonpb.RateLimitDescriptor{d("user", "u", "request_id", "after-release")}}); code != "OK" || len(got) != 1 || got[0] != (st{"OK", "10/UNKNOWN", 0}) {
		t.Errorf("a stream after one released = %s %+v, want OK with the released slot, 0 left", code, got)
	}
	if n := sum(t, h.reg, "sluice_envoy_descriptors_total", "released"); n != 1 {
		t.Errorf("released = %v, want 1 (the stream-done call with a limit released its lease)", n)
	}
	rule := rules.PolicyID("api.user.request_id")
	if n := counter(t, h.reg, "sluice_envoy_ignored_limit_total", "rule", rule); n != streams+1 {
		t.Errorf("sluice_envoy_ignored_limit_total{rule=%q} = %v, want %d (every descriptor whose limit was ignored)", rule, n, streams+1)
	}
}

// counter is the value of the counter name whose label is value, 0 when
// there is none.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestOverrideSubjectNamesNoValue: why a tenant plan reaches no
// descriptor names its entries by key, never by value (the value names
// a tenant, and the reason reaches the admin API's request log).
func TestOverrideSubjectNamesNoValue(t *testing.T) {
	var state *rls.State
	startWith(t, memStore(t), inFlightRules, func(st *rls.State) { state = st })
	for _, entries := range [][]rules.Entry{
		{{Key: "nope", Value: "tenant-secret-1"}},
		{{Key: "user", Value: "tenant-secret-1"}},
	} {
		_, _, _, err := state.OverrideSubject("api", entries)
		if err == nil || strings.Contains(err.Error(), "tenant-secret-1") || !strings.Contains(err.Error(), entries[0].Key) {
			t.Errorf("OverrideSubject(%v) = %v, want an error naming the key %s, not its value", entries, err, entries[0].Key)
		}
	}
}
