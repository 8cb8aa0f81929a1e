package rlqs

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
)

func TestTarget(t *testing.T) {
	p := share{rate: 100_000, burst: 200_000} // 100/s, burst 200
	rows := []struct {
		name        string
		n, total, d int64
		want        share
	}{
		{"alone, no demand: all but one floor", 1, 0, 0, share{100_000 * 15 / 16, 200_000 * 15 / 16}},
		{"alone with demand: floor + 7/8", 1, 10, 10, share{6250 + 87_500, 12_500 + 175_000}},
		{"two, no demand: halves of all but a floor", 2, 0, 0, share{100_000 * 23 / 48, 200_000 * 23 / 48}},
		{"two, all the demand", 2, 100, 100, share{4166 + 87_500, 8333 + 175_000}},
		{"two, none of the demand: the floor", 2, 100, 0, share{4166, 8333}},
		{"demand above the total is the total", 2, 100, 500, share{4166 + 87_500, 8333 + 175_000}},
		{"skewed 9:1, the large one", 2, 1000, 900, share{4166 + 78_750, 8333 + 157_500}},
	}
	for _, r := range rows {
		if got := target(p, r.n, r.total, r.d); got != r.want {
			t.Errorf("%s: target(%v, n=%d, total=%d, d=%d) = %v, want %v", r.name, p, r.n, r.total, r.d, got, r.want)
		}
	}
}

func TestTargetsLeaveAFloorFree(t *testing.T) {
	p := share{rate: 1_000_003, burst: 777_777}
	for _, ds := range [][]int64{{0, 0, 0}, {1, 2, 3}, {1000, 0, 0, 0, 0}, {5}} {
		var total int64
		for _, d := range ds {
			total += d
		}
		var sum share
		for _, d := range ds {
			s := target(p, int64(len(ds)), total, d)
			sum.rate, sum.burst = sum.rate+s.rate, sum.burst+s.burst
		}
		free := floorShare(p, int64(len(ds)))
		if sum.rate+free.rate > p.rate || sum.burst+free.burst > p.burst {
			t.Errorf("demands %v: targets sum to %v, with a floor %v free above the policy %v", ds, sum, free, p)
		}
	}
}

func TestKeeps(t *testing.T) {
	rows := []struct {
		name string
		a, t share
		want bool
	}{
		{"same", share{1000, 2000}, share{1000, 2000}, true},
		{"10 % up", share{1000, 2000}, share{1100, 2200}, true},
		{"10 % down", share{1000, 2000}, share{900, 1800}, true},
		{"11 % up", share{1000, 2000}, share{1110, 2200}, false},
		{"burst moves 20 %", share{1000, 2000}, share{1000, 2400}, false},
		{"nothing assigned yet", share{}, share{}, false},
	}
	for _, r := range rows {
		if got := keeps(r.a, r.t); got != r.want {
			t.Errorf("%s: keeps(%v, %v) = %v, want %v", r.name, r.a, r.t, got, r.want)
		}
	}
}

func TestSettle(t *testing.T) {
	rows := []struct {
		name      string
		committed []share
		want      []share
		reserved  share
		assigned  []share
		held      []share // committed after settle
	}{
		{"increases fit: given as wanted",
			[]share{{100, 100}, {100, 100}}, []share{{300, 300}, {200, 200}}, share{500, 500},
			[]share{{300, 300}, {200, 200}}, []share{{300, 300}, {200, 200}}},
		{"a decrease goes out; the increase is held to the reservation, counting the old share still in force",
			[]share{{600, 600}, {100, 100}}, []share{{200, 200}, {600, 600}}, share{700, 700},
			[]share{{200, 200}, {100, 100}}, []share{{600, 600}, {100, 100}}},
		{"two increases share the room in proportion",
			[]share{{100, 100}, {100, 100}}, []share{{500, 500}, {300, 300}}, share{500, 500},
			[]share{{100 + 200, 100 + 200}, {100 + 100, 100 + 100}}, []share{{300, 300}, {200, 200}}},
		{"no room: increases wait",
			[]share{{500, 500}}, []share{{900, 900}}, share{500, 500},
			[]share{{500, 500}}, []share{{500, 500}}},
		{"rate and burst fit apart",
			[]share{{100, 100}}, []share{{400, 400}}, share{400, 200},
			[]share{{400, 200}}, []share{{400, 200}}},
	}
	for _, r := range rows {
		hs := make([]*hold, len(r.committed))
		for i, c := range r.committed {
			hs[i] = &hold{assigned: c, committed: c}
		}
		settle(hs, r.want, ledger.Grant{Reserved: r.reserved.rate, ReservedBurst: r.reserved.burst})
		var got, held []share
		var sum share
		for _, h := range hs {
			got, held = append(got, h.assigned), append(held, h.committed)
			sum.rate, sum.burst = sum.rate+h.committed.rate, sum.burst+h.committed.burst
		}
		if diff := cmp.Diff(r.assigned, got, cmp.AllowUnexported(share{})); diff != "" {
			t.Errorf("%s: assignments (-want +got):\n%s", r.name, diff)
		}
		if diff := cmp.Diff(r.held, held, cmp.AllowUnexported(share{})); diff != "" {
			t.Errorf("%s: committed (-want +got):\n%s", r.name, diff)
		}
		if sum.rate > r.reserved.rate || sum.burst > r.reserved.burst {
			t.Errorf("%s: committed sums to %v, above the reservation %v", r.name, sum, r.reserved)
		}
	}
}

func TestFresh(t *testing.T) {
	p := share{80_000, 80_000}
	rows := []struct {
		name     string
		n        int64
		reserved share
		want     share
	}{
		{"room for a floor", 1, share{60_000, 60_000}, share{5000, 5000}},
		{"room for part of a floor", 1, share{51_000, 52_000}, share{1000, 2000}},
		{"no room: DENY_ALL until the round", 1, share{50_000, 50_000}, share{}},
	}
	for _, r := range rows {
		old := &hold{assigned: share{50_000, 50_000}, committed: share{50_000, 50_000}, demand: 3}
		h := &hold{fresh: true, demand: 1}
		c := claimFresh(p, r.n, []*hold{old, h})
		if c.Committed != 50_000 || c.Wish != 50_000+floorShare(p, r.n).rate || c.Streams != 2 || c.Demand != 4 {
			t.Errorf("%s: claimFresh = %+v", r.name, c)
		}
		settleFresh(p, r.n, []*hold{old, h}, ledger.Grant{Reserved: r.reserved.rate, ReservedBurst: r.reserved.burst})
		if h.assigned != r.want || h.committed != r.want || h.fresh {
			t.Errorf("%s: fresh stream got %+v, want assigned and committed %v", r.name, *h, r.want)
		}
	}
}

func TestStrategy(t *testing.T) {
	tb := func(maxTokens, perFill uint32, fill time.Duration) *typepb.RateLimitStrategy {
		s := strategy(share{1000, 1000}) // any token bucket, then its numbers
		b := s.GetTokenBucket()
		b.MaxTokens, b.TokensPerFill.Value, b.FillInterval = maxTokens, perFill, durationpb.New(fill)
		return s
	}
	deny := blanket(typepb.RateLimitStrategy_DENY_ALL)
	rows := []struct {
		name string
		s    share
		want *typepb.RateLimitStrategy
	}{
		{"whole tokens per second", share{10_000, 20_000}, tb(20, 10, time.Second)},
		{"fractions: the longest whole-second fill that rounds down least (659/60 s = 10.983)", share{10_999, 20_999}, tb(20, 659, 60*time.Second+59)},
		{"half a token a second: one every 2 s (and 1 ns: Envoy tells fill intervals apart by their nanos)", share{500, 5000}, tb(5, 1, 2*time.Second+1)},
		{"0.3 a second: 3 every 10 s, exact", share{300, 5000}, tb(5, 3, 10*time.Second+9)},
		{"a rate too small for a token in 60 s still has one now and then", share{1, 1000}, tb(1, 1, 1000*time.Second+999)},
		{"no rate: DENY_ALL", share{0, 5000}, deny},
		{"burst below one token: DENY_ALL", share{5000, 999}, deny},
	}
	for _, r := range rows {
		if diff := cmp.Diff(r.want, strategy(r.s), protocmp.Transform()); diff != "" {
			t.Errorf("%s: strategy(%v) (-want +got):\n%s", r.name, r.s, diff)
		}
	}
}

// TestStrategyRate: the rate Envoy enforces for a share of ρ tokens/s
// (tokens_per_fill per whole second of fill_interval, refilled
// continuously) is never above ρ, so the shares sent sum to at most the
// policy, and is within 1 % below it whenever some whole-second fill
// interval of at most 60 s holds 100 tokens or more: rounding each share
// down to whole tokens per whole second lost 8 % of a limit of 100/s over
// 16 proxies (6.25/s → 6/s) and 20 % of 10/s (0.625/s → 0.5/s). Below
// that it is the best rate a fill interval of 1 to 60 s gives, and below
// one token a minute one token every ⌈1/ρ⌉ s.
func TestStrategyRate(t *testing.T) {
	enforced := func(tb *typepb.TokenBucket) float64 {
		return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
	}
	for _, r := range []struct {
		rate    int64 // ρ, milli-tokens per second
		seconds int64 // the fill_interval chosen, F
		tokens  uint32
	}{
		{100_000, 1, 100},  // 100/s: exact at once
		{6250, 4, 25},      // 100/s over 16 proxies: 6.25/s, exact (was 6/s)
		{6204, 54, 335},    // 100·(1 − 1/136)/16: 6.2037/s (was 6/s)
		{625, 8, 5},        // 10/s over 16 proxies: 0.625/s, exact (was 0.5/s)
		{1318, 41, 54},     // a quiet proxy's floor and demand share: 1.3171/s (was 1/s)
		{99_999, 60, 5999}, // 99.983/s (was 99/s)
		{1500, 2, 3},       // 1.5/s (was 1/s)
		{17, 59, 1},        // about one a minute: 1/59 s ≤ 0.017
		{16, 63, 1},        // under one token in 60 s: one every ⌈1/ρ⌉ s
		{1, 1000, 1},       // one a thousand seconds
		{math.MaxInt64, 1, math.MaxUint32},
	} {
		tb := strategy(share{r.rate, 1000}).GetTokenBucket()
		if got := [2]int64{tb.GetFillInterval().GetSeconds(), int64(tb.GetTokensPerFill().GetValue())}; got != [2]int64{r.seconds, int64(r.tokens)} {
			t.Errorf("ρ = %d milli/s: fill %d s, %d tokens; want %d s, %d tokens", r.rate, got[0], got[1], r.seconds, r.tokens)
		}
	}
	for rate := int64(1); rate <= 300_000; rate += 1 + rate/1000 {
		tb := strategy(share{rate, 1000}).GetTokenBucket()
		rho, got := float64(rate)/1000, enforced(tb)
		if got > rho {
			t.Fatalf("ρ = %d milli/s: Envoy enforces %v/s, above ρ", rate, got)
		}
		if 60*rate >= 100_000 && got < 0.99*rho {
			t.Fatalf("ρ = %d milli/s: Envoy enforces %v/s, more than 1 %% below ρ", rate, got)
		}
		for f := int64(1); f <= 60; f++ {
			if best := float64(rate*f/1000) / float64(f); best > got {
				t.Fatalf("ρ = %d milli/s: Envoy enforces %v/s; %d tokens every %d s would give %v/s", rate, got, rate*f/1000, f, best)
			}
		}
	}
}

// TestFloorOfSixteen: the floor share of a stream among 16 is a token
// bucket exactly when the policy's burst is at least 136 and its rate at
// least 0.136 a second, else DENY_ALL: the thresholds of the config's
// warning (config.smallFloor) and of docs/rlqs.md, "Small policies".
func TestFloorOfSixteen(t *testing.T) {
	for _, r := range []struct {
		limit, burst int64
		window       time.Duration
		token        bool
	}{
		{100, 136, time.Second, true},
		{100, 135, time.Second, false},
		{136, 136, 1000 * time.Second, true}, // 0.136/s: one token every 1000 s
		{135, 136, 1000 * time.Second, false},
	} {
		f := floorShare(policyShare(sluice.Policy{Limit: r.limit, Burst: r.burst, Window: r.window}), 16)
		if got := strategy(f).GetTokenBucket() != nil; got != r.token {
			t.Errorf("limit %d per %v, burst %d: the floor among 16 is %+v: a token bucket = %v, want %v", r.limit, r.window, r.burst, f, got, r.token)
		}
	}
}

// envoySame is Envoy's protoTokenBucketsEq (global_client_impl.cc, cited
// in docs/rlqs.md): max_tokens, tokens_per_fill and fill_interval's nanos,
// not its seconds. Two token buckets it calls the same keep the limiter
// in force, whatever rate the second one says.
func envoySame(a, b *typepb.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() && a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// TestStrategyDistinctToEnvoy: every two shares that encode to different
// token buckets are different to Envoy's comparison too (else a change
// that differs only in fill_interval's seconds is ignored, and Envoy keeps
// the old, higher rate), and the rate Envoy reads (tokens_per_fill per
// whole second of fill_interval, truncated) is the encoded one.
func TestStrategyDistinctToEnvoy(t *testing.T) {
	type enc struct {
		seconds   int64
		perFill   uint32
		maxTokens uint32
	}
	seen := map[[3]int64]enc{}
	for _, burst := range []int64{1000, 2000, 7000} {
		for rate := int64(1); rate <= 12_000; rate++ {
			tb := strategy(share{rate, burst}).GetTokenBucket()
			if tb == nil {
				continue
			}
			fi := tb.GetFillInterval()
			e := enc{fi.GetSeconds(), tb.GetTokensPerFill().GetValue(), tb.GetMaxTokens()}
			if whole := fi.AsDuration().Truncate(time.Second); whole != time.Duration(e.seconds)*time.Second {
				t.Fatalf("strategy(%d, %d): fill_interval %v reads as %v in Envoy, want %d s", rate, burst, fi.AsDuration(), whole, e.seconds)
			}
			k := [3]int64{int64(e.maxTokens), int64(e.perFill), int64(fi.GetNanos())}
			if was, ok := seen[k]; ok && was != e {
				t.Fatalf("strategy(%d, %d) = %+v and an earlier %+v are the same token bucket to Envoy", rate, burst, e, was)
			}
			seen[k] = e
			prev := strategy(share{rate - 1, burst}).GetTokenBucket()
			if prev != nil && !proto.Equal(prev, tb) && envoySame(prev, tb) {
				t.Fatalf("strategy(%d, %d) and strategy(%d, %d) differ but are the same to Envoy", rate-1, burst, rate, burst)
			}
		}
	}
}

func TestTTLAndDemand(t *testing.T) {
	for _, r := range []struct {
		period, want time.Duration
	}{{0, 15 * time.Second}, {time.Second, 3 * time.Second}, {5 * time.Second, 15 * time.Second}, {time.Hour, 180 * time.Second}} {
		if got := ttl(r.period); got != r.want {
			t.Errorf("ttl(%v) = %v, want %v", r.period, got, r.want)
		}
	}
	for _, r := range []struct {
		name    string
		prev    int64
		first   bool
		n       uint64
		elapsed time.Duration
		want    int64
	}{
		{"first report: its rate", 0, true, 50, 5 * time.Second, 10_000},
		{"then half the old, half the new", 10_000, false, 0, 5 * time.Second, 5000},
		{"elapsed 0 counts as 1 s (a new bucket's first report from Envoy)", 0, true, 7, 0, 7000},
		{"elapsed under 1 s counts as 1 s", 10_000, false, 7, 500 * time.Millisecond, 8500},
		{"a stream's demand is at most maxDemand", 0, true, math.MaxUint64, 0, maxDemand},
		{"and stays so", maxDemand, false, math.MaxUint64, time.Second, maxDemand},
	} {
		if got := ewma(r.prev, r.first, r.n, r.elapsed); got != r.want {
			t.Errorf("%s: ewma(%d, %v, %d, %v) = %d, want %d", r.name, r.prev, r.first, r.n, r.elapsed, got, r.want)
		}
	}
	if got := policyShare(sluice.Policy{Limit: 100, Window: time.Minute}); got != (share{1666, 100_000}) {
		t.Errorf("policyShare(100 per minute) = %v, want {1666 100000}", got)
	}
}

// instance is one sluice instance's state of one bucket, in
// TestSplitNeverExceedsThePolicy.
type instance struct {
	id    string
	hs    []*hold
	fleet fleet
}

// TestSplitNeverExceedsThePolicy plays random rounds of several
// instances on one memory ledger, streams joining (answered at once),
// leaving and moving their demand, and checks the bound's core after
// every step: what the fleet's streams may have in force sums to at most
// the policy's rate and burst; and a newcomer gets its floor at once
// when the policy has it free.
func TestSplitNeverExceedsThePolicy(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	l := ledger.NewMemory(clk.Now)
	p := share{rate: 50_000, burst: 120_000}
	ins := []*instance{{id: "a"}, {id: "b"}, {id: "c"}}
	ctx := context.Background()
	claim := func(in *instance, c ledger.Claim) ledger.Grant {
		c.Bucket = "x"
		gs, err := l.Claim(ctx, "d", in.id, []ledger.Claim{c}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		in.fleet.update(c, gs[0])
		return gs[0]
	}
	reserved := map[string]ledger.Grant{}
	for step := range 20_000 {
		in := ins[rng.IntN(len(ins))]
		switch k := rng.IntN(10); {
		case k < 2 && len(in.hs) < 12: // a stream joins
			h := &hold{fresh: true, demand: rng.Int64N(10_000)}
			in.hs = append(in.hs, h)
			n, _ := in.fleet.now(in.hs[:len(in.hs)-1])
			var others, mine int64
			for id, g := range reserved {
				if id != in.id {
					others += g.Reserved
				}
			}
			for _, h := range in.hs {
				mine += h.committed.rate
			}
			free := p.rate-others-mine >= floorShare(p, n).rate
			g := claim(in, claimFresh(p, n, in.hs))
			reserved[in.id] = g
			settleFresh(p, n, in.hs, g)
			if free && h.assigned.rate != floorShare(p, n).rate {
				t.Fatalf("seed %d step %d: a newcomer got %v with a floor %v free", seed, step, h.assigned, floorShare(p, n))
			}
		case k < 3 && len(in.hs) > 0: // a stream leaves
			i := rng.IntN(len(in.hs))
			in.hs = append(in.hs[:i], in.hs[i+1:]...)
		case k < 6 && len(in.hs) > 0: // demand moves
			in.hs[rng.IntN(len(in.hs))].demand = rng.Int64N(10_000) * rng.Int64N(2)
		default: // a round
			n, total := in.fleet.now(in.hs)
			c, want := plan(p, n, total, in.hs)
			g := claim(in, c)
			reserved[in.id] = g
			settle(in.hs, want, g)
		}
		clk.advance(time.Millisecond)
		var sum share
		for _, in := range ins {
			for _, h := range in.hs {
				sum.rate, sum.burst = sum.rate+h.committed.rate, sum.burst+h.committed.burst
			}
		}
		if sum.rate > p.rate || sum.burst > p.burst {
			t.Fatalf("seed %d step %d: the fleet's committed shares sum to %v, above the policy %v", seed, step, sum, p)
		}
	}
}

// TestSplitFollowsDemand: two streams of one instance with demand 9:1
// get shares near 9:1 after a few rounds, summing to at most the policy.
func TestSplitFollowsDemand(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	l := ledger.NewMemory(clk.Now)
	p := share{rate: 100_000, burst: 100_000}
	in := &instance{id: "a", hs: []*hold{{demand: 90_000}, {demand: 10_000}}}
	for range 5 {
		n, total := in.fleet.now(in.hs)
		c, want := plan(p, n, total, in.hs)
		c.Bucket = "x"
		gs, err := l.Claim(context.Background(), "d", "a", []ledger.Claim{c}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		in.fleet.update(c, gs[0])
		settle(in.hs, want, gs[0])
		clk.advance(time.Second)
	}
	a, b := in.hs[0].assigned, in.hs[1].assigned
	if a.rate+b.rate > p.rate || a.rate < 6*b.rate {
		t.Fatalf("shares %v and %v for demand 9:1 under %v: want skewed, summing to at most the policy", a, b, p)
	}
}

// fakeClock is a clock advanced by hand, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
