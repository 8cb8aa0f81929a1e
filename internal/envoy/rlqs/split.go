package rlqs

import (
	"math"
	"math/bits"
	"time"

	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
)

// The split of one bucket's policy among the streams that report it: pure
// functions of integers, no clock, no lock (RLQS-DESIGN.md, "The split").
// Rates are milli-tokens per second, bursts milli-tokens, demand
// milli-requests per second.
//
// The invariant they keep, with the ledger's: at every instant the
// amounts a stream of this instance may have in force (committed) sum to
// at most the instance's reservation, and the reservations of every
// instance sum to at most the policy. plan makes each stream's committed
// its assignment (the previous one was delivered within a round: the
// bound's assumption) and claims that sum; the ledger reserves at least
// it; settle then raises assignments only within the reservation,
// counting for each stream the larger of its old and new assignment
// (either may be in force until the next round); fresh gives a newcomer
// only what the reservation holds beyond what is committed. Between
// these steps committed only falls (streams leave), so the sum never
// exceeds the reservation.

// share is a rate and a burst.
type share struct{ rate, burst int64 }

func (a share) max(b share) share { return share{max(a.rate, b.rate), max(a.burst, b.burst)} }

func (a share) plus(b share) share { return share{a.rate + b.rate, a.burst + b.burst} }

// less is g with its reservation less a, never below 0: what is left of
// it for the holds once a is counted.
func less(g ledger.Grant, a share) ledger.Grant {
	g.Reserved, g.ReservedBurst = max(g.Reserved-a.rate, 0), max(g.ReservedBurst-a.burst, 0)
	return g
}

// hold is one stream's state on one bucket, as the split sees it.
type hold struct {
	demand    int64 // smoothed demand (ewma)
	assigned  share // the last assignment sent
	committed share // what may be in force: max(previous, assigned) until the next round
	fresh     bool  // reported once, not yet assigned
	target    share // the last round's target
}

// hysteresis is the change of a stream's share, in tenths of it, that
// the split lets pass: a stream keeps its assignment while its target is
// within 10 % of it (a changed token bucket keeps its fill ratio in
// Envoy, so every change costs the stream some of its tokens).
const hysteresis = 10

// mulDiv returns ⌊a·b/c⌋ for a, b ≥ 0 and c > 0, at most MaxInt64, with
// the product in 128 bits.
func mulDiv(a, b, c int64) int64 {
	if a <= 0 || b <= 0 || c <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// policyShare is p's rate and burst: Limit per Window, and Burst
// (default Limit).
func policyShare(p sluice.Policy) share {
	burst := p.Burst
	if burst == 0 {
		burst = p.Limit
	}
	return share{rate: mulDiv(p.Limit, 1e12, p.Window.Nanoseconds()), burst: mulDiv(burst, 1000, 1)}
}

// floorShare is φ·p with φ = 1/(8(n+1)): the least target of each of n
// streams, and what the split leaves free for a newcomer.
func floorShare(p share, n int64) share {
	d := 8 * (max(n, 0) + 1)
	return share{p.rate / d, p.burst / d}
}

// target is the share a stream of demand d deserves among n streams of
// demand total: φ·p + (1 − (n+1)φ)·p·d/total = p/(8(n+1)) + 7p·d/(8·total)
// when total > 0, else p·(1−φ)/n. Over the n streams the targets sum to
// at most p·(1−φ): one floor stays free for a newcomer.
func target(p share, n, total, d int64) share {
	n = max(n, 1)
	if total <= 0 {
		k := 8 * (n + 1)
		return share{mulDiv(p.rate, k-1, k*n), mulDiv(p.burst, k-1, k*n)}
	}
	d = min(max(d, 0), total)
	f := floorShare(p, n)
	return share{f.rate + mulDiv(p.rate, 7*d, 8*total), f.burst + mulDiv(p.burst, 7*d, 8*total)}
}

// keeps reports whether an assignment a stays when the target is t: both
// within 10 % of a.
func keeps(a, t share) bool {
	near := func(a, t int64) bool { return a > 0 && (t-a)*hysteresis <= a && (a-t)*hysteresis <= a }
	return near(a.rate, t.rate) && near(a.burst, t.burst)
}

// plan starts a round for one bucket of policy p: each stream's committed
// becomes its assignment, and the claim asks for the targets of hs among
// the fleet's n streams of demand total (this instance's current values
// already in both). It returns the claim (Bucket unset) and each
// stream's wanted share: its target, or its assignment where hysteresis
// keeps it.
func plan(p share, n, total int64, hs []*hold) (ledger.Claim, []share) {
	want := make([]share, len(hs))
	return planInto(p, n, total, hs, want), want
}

// planInto is plan writing the wanted shares into want (len(hs)), so a
// round can reuse it.
func planInto(p share, n, total int64, hs []*hold, want []share) ledger.Claim {
	c := ledger.Claim{Rate: p.rate, Burst: p.burst, Streams: int64(len(hs))}
	var local int64
	for _, h := range hs {
		local += h.demand
	}
	n, total = max(n, int64(len(hs))), max(total, local)
	for i, h := range hs {
		h.committed = h.assigned
		t := target(p, n, total, h.demand)
		h.target = t
		c.Demand += h.demand
		c.Committed += h.committed.rate
		c.CommittedBurst += h.committed.burst
		want[i] = t
		// Held within 10 %, unless below its target while the stream asks
		// for more than it has: it spends all it has (its Envoy's bucket
		// is empty, so the change costs it nothing), and holding it would
		// leave the limit unused while demand exceeds it.
		short := t.rate > h.assigned.rate && h.demand > h.assigned.rate
		if keeps(h.assigned, t) && !short {
			want[i] = h.assigned
		}
	}
	unkeepAbove(p, hs, n, total, want)
	// The claim wishes for what the split means to hold this round: each
	// stream's wanted share (its target, or the assignment the hysteresis
	// keeps), or its committed amount while that is more (a decrease is
	// in force until the next round). A grant below it is the fleet
	// saying the other instances hold the rest (fitDown).
	for i, h := range hs {
		w := want[i].max(h.committed)
		c.Wish, c.WishBurst = c.Wish+w.rate, c.WishBurst+w.burst
	}
	return c
}

// unkeepAbove is the hysteresis' budget: when the assignments of hs
// sum above the policy p — a plan or a Swap lowered it, by less than the
// 10 % the hysteresis lets pass — the streams held above their targets
// get their targets, which sum to at most p·(1−φ). Without it a stream
// alone on a bucket whose policy went from 100/s to 90/s keeps 93.75/s
// for good, and the ledger reserves it (it is committed). Under
// unchanged numbers the assignments sum to at most the reservation, at
// most p, and nothing changes here.
func unkeepAbove(p share, hs []*hold, n, total int64, want []share) {
	var sum share
	for _, h := range hs {
		sum.rate, sum.burst = sum.rate+h.assigned.rate, sum.burst+h.assigned.burst
	}
	if sum.rate <= p.rate && sum.burst <= p.burst {
		return
	}
	for i, h := range hs {
		if t := target(p, n, total, h.demand); want[i].rate > t.rate || want[i].burst > t.burst {
			want[i] = t
		}
	}
}

// settle sets the assignments of hs from want within the reservation g
// granted: decreases as wanted, increases scaled down together so that
// Σ max(committed, new) ≤ the reservation (rate and burst apart). Each
// stream's committed becomes max(committed, new). It reports which
// assignments changed.
func settle(hs []*hold, want []share, g ledger.Grant) []bool {
	return settleInto(hs, want, g, make([]int64, len(hs)), make([]int64, len(hs)), make([]bool, len(hs)))
}

// settleInto is settle with its scratch given (rates, bursts and changed
// of len(hs)), so a round can reuse them; it returns changed.
func settleInto(hs []*hold, want []share, g ledger.Grant, rates, bursts []int64, changed []bool) []bool {
	for i := range hs {
		rates[i], bursts[i] = want[i].rate, want[i].burst
	}
	fitUp(hs, rates, func(h *hold) int64 { return h.committed.rate }, g.Reserved)
	fitUp(hs, bursts, func(h *hold) int64 { return h.committed.burst }, g.ReservedBurst)
	for i, h := range hs {
		n := share{rates[i], bursts[i]}
		changed[i] = n != h.assigned
		h.assigned, h.committed = n, h.committed.max(n)
	}
	return changed
}

// fitDown gives the streams of hs the hysteresis keeps above their
// targets their targets, where the ledger granted less than the claim c
// wished for and less than the policy: the other instances hold the
// rest. Without it, instances whose streams the hysteresis keeps (a plan
// lowered the policy by less than 10 %) would each hold them above what
// the fleet leaves it, each one's sum under the policy and the fleet's
// above it, for good. Alone on a bucket (or not squeezed) nothing
// changes.
func fitDown(hs []*hold, want []share, c ledger.Claim, g ledger.Grant) {
	if g.Rate >= min(c.Wish, c.Rate) && g.Burst >= min(c.WishBurst, c.Burst) {
		return
	}
	for i, h := range hs {
		if want[i].rate > h.target.rate || want[i].burst > h.target.burst {
			want[i] = h.target
		}
	}
}

// fitUp scales the increases of want over each hold's committed amount
// (of) down together so that Σ max(committed, want) ≤ reserved.
func fitUp(hs []*hold, want []int64, of func(*hold) int64, reserved int64) {
	var base, up int64
	for i, h := range hs {
		c := of(h)
		base += c
		up += max(want[i]-c, 0)
	}
	room := max(reserved-base, 0)
	if up <= room {
		return
	}
	for i, h := range hs {
		if c := of(h); want[i] > c {
			want[i] = c + mulDiv(want[i]-c, room, up)
		}
	}
}

// settled is what the first-report claims need of a bucket's settled
// holds (those not fresh): how many, and their demand and committed
// amounts summed. The service keeps it as holds change, so that a
// stream's first report costs its buckets, not their other holders.
type settled struct {
	n         int64
	demand    int64
	committed share
}

func (s *settled) add(h *hold) {
	s.n++
	s.demand += h.demand
	s.committed.rate += h.committed.rate
	s.committed.burst += h.committed.burst
}

func (s *settled) remove(h *hold) {
	s.n--
	s.demand -= h.demand
	s.committed.rate -= h.committed.rate
	s.committed.burst -= h.committed.burst
}

// split returns the settled holds of hs summed, and the fresh ones, in
// order.
func split(hs []*hold) (settled, []*hold) {
	var s settled
	var fresh []*hold
	for _, h := range hs {
		if h.fresh {
			fresh = append(fresh, h)
		} else {
			s.add(h)
		}
	}
	return s, fresh
}

// claimFresh is the claim that answers the fresh streams of hs at once:
// one floor each (among the fleet's n streams before them) on top of
// what is committed.
func claimFresh(p share, n int64, hs []*hold) ledger.Claim {
	s, fresh := split(hs)
	return claimFreshOf(p, n, s, fresh)
}

// claimFreshOf is claimFresh of the holds s sums and fresh.
func claimFreshOf(p share, n int64, s settled, fresh []*hold) ledger.Claim {
	f := floorShare(p, n)
	c := ledger.Claim{Rate: p.rate, Burst: p.burst, Streams: s.n + int64(len(fresh)),
		Demand: s.demand, Committed: s.committed.rate, CommittedBurst: s.committed.burst,
		Wish: s.committed.rate, WishBurst: s.committed.burst}
	for _, h := range fresh {
		c.Demand += h.demand
		c.Committed += h.committed.rate
		c.CommittedBurst += h.committed.burst
		c.Wish += f.rate
		c.WishBurst += f.burst
	}
	return c
}

// settleFresh gives each fresh stream of hs, in order, a floor (among n
// streams) from what reservation g holds beyond the committed amounts,
// or what is left of it: 0 when nothing is (DENY_ALL until the next
// round).
func settleFresh(p share, n int64, hs []*hold, g ledger.Grant) {
	s, fresh := split(hs)
	settleFreshOf(p, n, s, fresh, g)
}

// settleFreshOf is settleFresh of the holds s sums and fresh.
func settleFreshOf(p share, n int64, s settled, fresh []*hold, g ledger.Grant) {
	f := floorShare(p, n)
	room := share{g.Reserved - s.committed.rate, g.ReservedBurst - s.committed.burst}
	for _, h := range fresh {
		room.rate -= h.committed.rate
		room.burst -= h.committed.burst
	}
	for _, h := range fresh {
		a := share{min(f.rate, max(room.rate, 0)), min(f.burst, max(room.burst, 0))}
		room.rate, room.burst = room.rate-a.rate, room.burst-a.burst
		h.assigned, h.committed, h.fresh = a, a, false
	}
}

// maxDemand is the most demand one stream may bring to one bucket, in
// milli-requests per second (a million requests a second): a report's
// counts are the stream's word, and without a bound a stream's demand
// could overflow the sums, or the ledger's exact range (claims whose
// Demand passes 2^53 − 1 are refused, a round lost for every stream of
// the domain). Up to 9 million streams on a bucket still sum below 2^53.
const maxDemand = 1_000_000_000

// ewma is the smoothed demand after a report of n requests over elapsed
// (whole seconds, at least 1): the first report's rate, then α = 1/2;
// at most maxDemand.
func ewma(prev int64, first bool, n uint64, elapsed time.Duration) int64 {
	secs := max(int64(elapsed/time.Second), 1)
	rate := min(int64(min(n, math.MaxInt64/1000))*1000/secs, maxDemand)
	if first {
		return rate
	}
	return prev/2 + rate/2
}

// The observed report period bounds: Envoy reports every 5 s; a period
// above maxPeriod is taken as maxPeriod, so an assignment's TTL (and the
// ledger entries that must outlive it) stays bounded.
const (
	defaultPeriod = 5 * time.Second
	maxPeriod     = 60 * time.Second
)

// ttl is an assignment's time to live for a stream whose observed report
// period is period (0: not observed yet): 3 periods, at least 1 s.
func ttl(period time.Duration) time.Duration {
	if period <= 0 {
		period = defaultPeriod
	}
	return max(3*min(period, maxPeriod), time.Second)
}

// strategy encodes a share as Envoy reads it: a token bucket of whole
// seconds (fillRate), every number rounded down (so shares never add up to
// more than the policy), or DENY_ALL when a number would be below 1.
//
// fill_interval carries fillNanos(seconds) nanoseconds beside its whole
// seconds: Envoy decides whether a token bucket is the one in force by
// max_tokens, tokens_per_fill and fill_interval's nanos, never its
// seconds, so without them a change of seconds alone would be ignored and
// the old rate kept. Envoy's rate reads whole seconds (truncated), so the
// nanos do not change it.
//
// tokens_per_fill may exceed max_tokens: Envoy refills continuously, at
// tokens_per_fill / fill_interval a second, capped at max_tokens
// (docs/rlqs.md, "Envoy's filter, as read").
func strategy(s share) *typepb.RateLimitStrategy {
	perFill, fill := fillRate(s.rate)
	maxTokens := min(s.burst/1000, math.MaxUint32)
	if perFill < 1 || maxTokens < 1 {
		return blanket(typepb.RateLimitStrategy_DENY_ALL)
	}
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_TokenBucket{TokenBucket: &typepb.TokenBucket{
		MaxTokens:     uint32(maxTokens),
		TokensPerFill: wrapperspb.UInt32(uint32(perFill)),
		FillInterval:  &durationpb.Duration{Seconds: fill, Nanos: fillNanos(fill)},
	}}}
}

// maxFill is the longest fill interval, in seconds, fillRate searches for
// the closest rate: one that holds 100 tokens or more brings the rate
// within 1 % of the share.
const maxFill = 60

// fillRate writes a rate of milli milli-tokens a second as tokens every
// fill seconds, never above it: of the whole seconds 1 to maxFill, the
// one whose ⌊ρ·fill⌋ / fill is the highest (the shortest of equals), so
// the rate is within 1 % of ρ whenever ρ·maxFill ≥ 100, and exact when a
// fill interval of at most maxFill seconds holds a whole number of
// tokens; below one token in maxFill seconds, 1 token every ⌈1/ρ⌉ s (at
// most 1000 s, ρ being at least 1 milli-token a second). (0, 0) for no
// rate.
func fillRate(milli int64) (tokens, seconds int64) {
	if milli <= 0 {
		return 0, 0
	}
	tokens, seconds = 0, 1
	for f := int64(1); f <= maxFill; f++ {
		t := min(mulDiv(milli, f, 1000), math.MaxUint32)
		if t*seconds > tokens*f { // t/f > tokens/seconds
			tokens, seconds = t, f
		}
	}
	if tokens == 0 {
		return 1, (1000 + milli - 1) / milli
	}
	return tokens, seconds
}

// fillNanos is the nanos of a fill_interval of seconds whole seconds
// (1 to 1000): seconds − 1, one-to-one, 0 for the usual 1 s, and below
// the 1 s that would change the whole seconds Envoy reads.
func fillNanos(seconds int64) int32 { return int32(seconds - 1) }

// blanket is the strategy of rule r.
func blanket(r typepb.RateLimitStrategy_BlanketRule) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// fleet is what the last ledger answer said of a bucket's fleet, and this
// instance's part of it then.
type fleet struct{ streams, demand, mineStreams, mineDemand int64 }

// now is the fleet's streams and demand with this instance's current hs
// in place of its part in the last answer.
func (f fleet) now(hs []*hold) (n, total int64) {
	var d int64
	for _, h := range hs {
		d += h.demand
	}
	return max(f.streams-f.mineStreams, 0) + int64(len(hs)), max(f.demand-f.mineDemand, 0) + d
}

// update records the answer g to claim c.
func (f *fleet) update(c ledger.Claim, g ledger.Grant) {
	*f = fleet{streams: g.Streams, demand: g.Demand, mineStreams: c.Streams, mineDemand: c.Demand}
}
