// Package algorithm holds the rate-limiting math of sluice, once.
//
// Every algorithm is a pure state machine over an explicit state value, an
// explicit now and an explicit cost: no clock, no I/O, no floating point.
// Time is integer microseconds since the Unix epoch and amounts are integers,
// so every intermediate value stays below 2^53 and the Lua ports in
// redisstore compute bit for bit the same results in Redis's doubles.
//
// Conventions shared by all five algorithms:
//
//   - cost > 0 spends cost units if the whole cost fits; a denial returns the
//     state unchanged (denied requests never extend a window).
//   - cost == 0 is a peek: the verdict is the one a cost of 1 would get, and
//     the state is returned unchanged.
//   - Decision.RetryAfter is 0 exactly when Allowed; otherwise it is the
//     earliest wait after which the same cost would be admitted if nothing
//     else is spent meanwhile.
//   - Decision.ResetAfter is the wait until the state is back to full
//     capacity (Remaining == Limit) if nothing else is spent.
//   - Expires reports the instant from which the state is indistinguishable
//     from an absent one, so stores can drop it (Redis TTL).
//   - The zero value of every state type is "absent".
package algorithm

import "fmt"

// Bounds every Params value satisfies. MaxExact is 2^53, the largest range
// in which Lua's doubles represent every integer exactly.
const (
	MinWindow int64 = 1_000 // 1ms in µs
	// MaxWindow is the longest window, 365 days in µs (envoyproxy/ratelimit's
	// year divider). The bound that matters is 2^53: every instant is µs
	// since the epoch below it (until the year 2255), and a window or a
	// period of at most MaxPeriod added to one stays below it.
	MaxWindow int64 = 365 * 86_400_000_000
	// MaxLeaseTTL is the longest a concurrency lease lives: 24h in µs.
	MaxLeaseTTL int64 = 86_400_000_000
	// MaxPeriod is the longest calendar period (KindFixedPeriod): a leap
	// year, and a day more for a zone that moves its offset back within
	// it, in µs.
	MaxPeriod        int64 = 367 * 86_400_000_000
	MaxLimit         int64 = 1_000_000_000
	MaxSlidingLogLen int64 = 100_000
	// MaxConcurrencyLimit is the most leases a concurrency policy holds
	// at once per subject: each is an entry of the state.
	MaxConcurrencyLimit int64 = 100_000
	MaxExact            int64 = 1 << 53
)

// Params are the numbers of one policy in the units the math uses.
type Params struct {
	Limit  int64 // units per window (window algorithms); rate numerator (bucket algorithms)
	Window int64 // µs; for concurrency, the lease TTL
	Burst  int64 // bucket capacity in units (token bucket, GCRA); Limit for window algorithms
	// Aligned fixed windows start on multiples of Window since the Unix
	// epoch (the UTC second, minute, hour, day) instead of at their first
	// admission. Only fixed_window has windows to align.
	Aligned bool
	// Reserve is the part of the capacity (Capacity) a request may not
	// use: what its priority class leaves to more important traffic,
	// Capacity − ⌊Capacity × share⌋ (package evaluation computes it). A
	// window algorithm or concurrency admits while the used part after
	// the request stays within Limit − Reserve; a bucket while it keeps
	// at least Reserve units (token_bucket's tokens, GCRA's tolerance)
	// after the spend. Remaining is then what the class can still use.
	// 0, the whole capacity, for every operation but an admission (Check).
	// An int32 (at most MaxLimit) beside Aligned, so Params stays 64
	// bytes: the engine copies it by value on every decision, and at 72
	// bytes BenchmarkCheck took about 1.15× as long.
	Reserve int32
	// Bounds are a calendar period's (KindFixedPeriod only): the start of
	// the period before the one holding the caller's clock, that one's
	// start, the next one's start and its end, µs (package period
	// computes them); Window is then the length of the middle one,
	// Bounds[2] − Bounds[1]. Zero for every other kind.
	Bounds [4]int64
}

// Kind names an algorithm inside this package.
type Kind uint8

// The algorithms, in the order of the root package's constants.
const (
	KindFixedWindow Kind = iota + 1
	KindSlidingLog
	KindSlidingWindow
	KindTokenBucket
	KindGCRA
	KindConcurrency
	// KindFixedWindowEnd is fixed_window where the store's own clock
	// decides and expires its keys (redisstore on Redis time): the same
	// decisions as KindFixedWindow, on a state of two integers
	// (FixedWindowEnd). No policy names it; a store picks it.
	KindFixedWindowEnd
	// KindFixedPeriod is fixed_window counting per calendar period
	// (FixedPeriod): its windows are the periods Params.Bounds name, on
	// either clock. A policy with a period picks it.
	KindFixedPeriod
)

var kindNames = [...]string{KindFixedWindow: "fixed_window", KindSlidingLog: "sliding_log", KindSlidingWindow: "sliding_window", KindTokenBucket: "token_bucket", KindGCRA: "gcra", KindConcurrency: "concurrency", KindFixedWindowEnd: "fixed_window", KindFixedPeriod: "fixed_window"}

// String returns the kind's config spelling, e.g. "token_bucket".
func (k Kind) String() string {
	if k >= KindFixedWindow && k <= KindFixedPeriod {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// RangeError says which number broke which rule.
type RangeError struct {
	Field string // "limit", "window", "burst"
	Value int64
	Rule  string
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("%s = %d: %s", e.Field, e.Value, e.Rule)
}

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// Capacity is the most units one decision could ever admit: Limit for the
// window algorithms, Burst for the bucket algorithms.
func (p Params) Capacity(k Kind) int64 {
	if k == KindTokenBucket || k == KindGCRA {
		return p.Burst
	}
	return p.Limit
}

// ceiling returns the most units of p's Limit a window algorithm or
// concurrency lets a request of p's priority class use: Limit − Reserve.
func (p Params) ceiling() int64 { return p.Limit - int64(p.Reserve) }

// Decision is the verdict of one evaluation. Durations are µs.
type Decision struct {
	Allowed    bool
	Limit      int64 // capacity: Remaining never exceeds it
	Remaining  int64 // units that could still be admitted now, after this decision
	ResetAfter int64 // µs until Remaining == Limit again if nothing is spent
	RetryAfter int64 // µs until this cost would be admitted; 0 iff Allowed
	Delay      int64 // µs an admitted OpBook waits for its slot; 0 for every other decision
}

// floorDiv returns ⌊a/b⌋ for any a and b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// verdictCost is the cost a decision is judged on: a peek (0) is judged as 1.
func verdictCost(cost int64) int64 {
	if cost == 0 {
		return 1
	}
	return cost
}

// Check reports the first number of p that the algorithm k cannot evaluate
// exactly, as a *RangeError.
func (p Params) Check(k Kind) error {
	switch {
	case k == KindConcurrency && (p.Window < MinWindow || p.Window > MaxLeaseTTL):
		return &RangeError{"window", p.Window, "must be between 1ms and 24h"}
	case k != KindFixedPeriod && (p.Window < MinWindow || p.Window > MaxWindow):
		return &RangeError{"window", p.Window, "must be between 1ms and 365 days (8760h)"}
	case p.Limit < 1 || p.Limit > MaxLimit:
		return &RangeError{"limit", p.Limit, "must be between 1 and 1000000000"}
	case p.Burst < 1 || p.Burst > MaxLimit:
		return &RangeError{"burst", p.Burst, "must be between 1 and 1000000000"}
	}
	if p.Aligned && k != KindFixedWindow && k != KindFixedWindowEnd {
		return &RangeError{"align", 1, "clock alignment applies only to fixed_window"}
	}
	switch k {
	case KindFixedWindow, KindFixedWindowEnd:
	case KindFixedPeriod:
		return p.checkBounds()
	case KindSlidingLog:
		if p.Limit > MaxSlidingLogLen {
			return &RangeError{"limit", p.Limit, "sliding_log keeps one entry per unit and allows at most 100000; use sliding_window for larger limits"}
		}
	case KindSlidingWindow:
		if p.Limit > (MaxExact-1)/p.Window {
			return &RangeError{"limit", p.Limit, fmt.Sprintf("limit × window in µs must stay below 2^53 for sliding_window; at this window the limit can be at most %d", (MaxExact-1)/p.Window)}
		}
	case KindConcurrency:
		if p.Limit > MaxConcurrencyLimit {
			return &RangeError{"limit", p.Limit, "concurrency keeps one entry per lease and allows at most 100000"}
		}
	case KindTokenBucket, KindGCRA:
		if p.Burst > (MaxExact-1-p.Limit)/p.Window {
			return &RangeError{"burst", p.Burst, fmt.Sprintf("burst × window in µs must stay below 2^53; at this window the burst can be at most %d", (MaxExact-1-p.Limit)/p.Window)}
		}
	default:
		return &RangeError{"algorithm", int64(k), "unknown algorithm"}
	}
	return nil
}
