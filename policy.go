package sluice

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/period"
	"github.com/sluicehq/sluice/internal/policydefaults"
	"github.com/sluicehq/sluice/internal/policyerr"
)

// Algorithm selects the math a policy uses. Its String form is the config
// spelling.
type Algorithm uint8

// The five rate algorithms, and concurrency. See the package documentation
// for how they compare.
const (
	FixedWindow   Algorithm = Algorithm(algorithm.KindFixedWindow)   // fixed_window
	SlidingLog    Algorithm = Algorithm(algorithm.KindSlidingLog)    // sliding_log
	SlidingWindow Algorithm = Algorithm(algorithm.KindSlidingWindow) // sliding_window
	TokenBucket   Algorithm = Algorithm(algorithm.KindTokenBucket)   // token_bucket
	GCRA          Algorithm = Algorithm(algorithm.KindGCRA)          // gcra
	// Concurrency limits how many leases a subject holds at once, not how
	// often it spends: see Policy.LeaseTTL and Op Acquire.
	Concurrency Algorithm = Algorithm(algorithm.KindConcurrency) // concurrency
)

// String returns the config spelling, e.g. "token_bucket".
func (a Algorithm) String() string {
	if a.valid() {
		return algorithm.Kind(a).String()
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

func (a Algorithm) valid() bool { return a >= FixedWindow && a <= Concurrency }

// Policy is one named limit. The zero value is not valid: ID, Algorithm,
// Limit and Window (or Period) are required; every other field's zero value means its
// documented default. A Policy is a plain value; Limiter keeps its own
// validated copy.
type Policy struct {
	// ID names the policy in requests, keys and metrics: 1 to 64 of
	// [A-Za-z0-9_.-].
	ID string
	// Revision is part of every key, so changing the numbers under a new
	// revision starts from fresh state. Default: 1.
	Revision int64
	// Algorithm is the math. Required.
	Algorithm Algorithm
	// Limit is the number of units per Window (for token_bucket and gcra:
	// the refill rate, Limit per Window). 1 to 1e9. For concurrency, the
	// most leases one subject holds at once, 1 to 100000. Required.
	Limit int64
	// Window is the period Limit applies to: 1ms to 365 days (8760h), a
	// whole number of microseconds (for token_bucket, gcra and
	// sliding_window also burst or limit × window in µs below 2^53).
	// Required, except for concurrency, which has none, and with a Period.
	Window time.Duration
	// Period makes a fixed_window count per calendar period instead of per
	// Window: "minute", "hour", "day", "week" (ISO, from Monday), "month"
	// or "year", each starting at the local :00 or midnight of TimeZone,
	// so "10000 per month" resets at 00:00 on the 1st, through DST changes
	// (a day is then 23 or 25 hours) and months of 28 to 31 days.
	// ResetAfter and Retry-After run to the period's real end; keys expire
	// there (plus CleanupGrace). The other algorithms refuse it: a bucket
	// refilling Limit per month is no calendar quota. Change it (or
	// TimeZone) with a new Revision. Default: "" (Window applies).
	Period string
	// TimeZone is where Period's boundaries are drawn, e.g. the result of
	// time.LoadLocation("Europe/Berlin"). Only with a Period. Default:
	// nil, UTC.
	TimeZone *time.Location
	// ClockAligned starts fixed_window windows on the clock's boundaries of
	// Window since the Unix epoch (with a 1m window: every UTC minute;
	// 24h: every UTC midnight), as envoyproxy/ratelimit does, instead of at
	// the first admitted request; ResetAfter then runs to the next
	// boundary. Every subject's window then closes at the same instant, so
	// a fleet's quotas reset together ("at midnight"). Its state has a key
	// of its own: turning it on or off starts from fresh state. Only
	// fixed_window has windows to align. Default: false (first request).
	ClockAligned bool
	// LeaseTTL is how long a concurrency lease lives unless it is released
	// or renewed first: a holder that dies without releasing gives its
	// slot back this long after it acquired it. Set it above the longest
	// time a request is expected to hold its lease (renew longer ones).
	// 1ms to 24h, a whole number of microseconds. Required for
	// concurrency; other algorithms reject it. Change it with a new
	// Revision.
	LeaseTTL time.Duration
	// Burst is the bucket capacity of token_bucket and gcra: how many units
	// may be spent at once after idling. Other algorithms do not use it and
	// reject any other value than 0 or Limit. Default: Limit.
	Burst int64
	// MaxCost is the largest cost one request may ask for; larger requests
	// are Incompatible. At most what the algorithm can ever admit at once
	// (Limit, or Burst for token_bucket and gcra). Default: that maximum.
	// Concurrency rejects it: a lease holds one slot whatever the cost.
	MaxCost int64
	// CleanupGrace is added to every key's TTL beyond the moment its state
	// equals absent, 0 to 1h. Default: 0.
	CleanupGrace time.Duration
	// DedupeTTL is how long a decision taken for a request with an
	// EvaluationID is remembered, so a retry with the same id gets the same
	// answer without spending again; 1ms to 1h. For a multi-policy request
	// the first policy's settings apply. Default: 5s.
	DedupeTTL time.Duration
	// DedupeMax bounds the evaluation ids remembered per subject and
	// policy, 1 to 10000; at the bound the oldest is forgotten first.
	// Default: 256.
	DedupeMax int
	// NearCache lets the Limiter deny a subject it saw denied again
	// without asking the store, until the retry time that denial named: a
	// flood from one subject then costs the store one call per retry time
	// instead of one per request. It never admits what the store would
	// deny (it only denies, and only a cost at least the denied one) and
	// never denies past the retry time, measured from before the store was
	// asked. It applies to requests naming this one policy, spending, with
	// no EvaluationID. A Reset clears it in this process only: other
	// processes deny until that time at most. Default: false.
	NearCache bool
	// MaxWait is the longest any Book (Limiter.Wait, Limiter.Reserve, a
	// queue's MaxDelay) of this policy waits for its slot, whatever the
	// request asks (Request.MaxWait may only ask for less): one whose
	// slot lies further ahead is Denied and books nothing. token_bucket and gcra only (the others have no future
	// slot to book); a whole number of µs, at most 24h and at most what
	// keeps the units booked ahead exact below 2^53. Default: the Window,
	// at most one minute (the units booked ahead are then at most Limit).
	MaxWait time.Duration
	// LocalQuota lets a Limiter admit a subject it sees often from blocks
	// of budget taken from the store, without a store call per request,
	// and never more than the algorithm allows: see LocalQuota. For
	// fixed_window, token_bucket and gcra. Default: off.
	LocalQuota LocalQuota
	// Priorities reserve part of the policy's capacity (Limit, or Burst
	// for token_bucket and gcra) for more important traffic: each class
	// named here may use that percent of it, 1 to 100, e.g.
	// {"critical": 100, "sheddable": 50}. Every class shares one state and
	// one budget; a request of a class (Request.Priority) is admitted only
	// while what is used after it stays within ⌊capacity × share / 100⌋
	// (a bucket: while it leaves at least the rest), so under contention
	// sheddable traffic never takes the reserved part while critical
	// traffic can use it all. A class not named here, and "default" (the
	// class of a request naming none) unless named, uses 100 %. Class names
	// are 1 to 32 of [a-z0-9_-], at most 8; each share must leave its class
	// at least one unit. Status.Remaining is then what that class can
	// still use. See docs/priorities.md. Default: none (every request may
	// use the whole capacity).
	Priorities map[string]int
}

// LocalQuota configures a policy's local quota. A Limiter that sees one
// subject of the policy often (at least 4 units asked in each of the last
// three BlockTimes) takes a block of units for it in one store decision,
// sized to the least it asked in those three, and admits from it itself
// until the block is spent or BlockTime has passed since the store was
// asked; a subject seen a few times a second does not take one. The store spends
// a block so that it covers every admission made from it (see
// Evaluation.Hold), so no instance, store call or clock read admits more
// than the algorithm would; what is left unspent when a block's time is
// up stays spent (it is lost to every instance until the algorithm
// frees it: that is local quota's cost, bounded by MaxBlock per subject
// and instance). A block is asked only while the store last said at
// least four times its cost remains, so a subject near its limit is
// decided by the store again, one request at a time, and its last units
// go exactly. A block in hand keeps admitting while the store is
// unreachable. Requests with an EvaluationID, several policies, Previous
// subjects, or another operation than Spend go to the store as before; a
// Reset drops this Limiter's blocks for the subject, not other
// processes'.
type LocalQuota struct {
	// Enabled turns local quota on. Default: false.
	Enabled bool
	// BlockTime is how long a block lives, from the moment its store call
	// starts: 1ms to 1s, at most half the Window (for token_bucket and
	// gcra, also at most the time to refill half the Burst), a whole
	// number of microseconds. Default: a tenth of Window, at most 100ms
	// (for token_bucket and gcra, also at most the time to refill an
	// eighth of Burst: what a block's hold drains of the bucket).
	BlockTime time.Duration
	// MaxBlock is the most units one block holds: 4 to half of MaxCost.
	// Default: a tenth of MaxCost, at least 4.
	MaxBlock int64
}

// fields returns p's defaulted fields and what their defaults depend on.
func (p *Policy) fields() policydefaults.Fields {
	return policydefaults.Fields{Kind: algorithm.Kind(p.Algorithm), Limit: p.Limit, Window: p.Window, LeaseTTL: p.LeaseTTL, Aligned: p.ClockAligned,
		Revision: p.Revision, Burst: p.Burst, MaxCost: p.MaxCost, DedupeTTL: p.DedupeTTL, DedupeMax: p.DedupeMax,
		LocalQuota: p.LocalQuota.Enabled, BlockTime: p.LocalQuota.BlockTime, MaxBlock: p.LocalQuota.MaxBlock, MaxWait: p.MaxWait}
}

// withDefaults returns p with every defaulted zero field filled in, by
// internal/policydefaults. It does not validate.
func (p Policy) withDefaults() Policy {
	f := p.fields()
	policydefaults.Apply(&f)
	p.Revision, p.Burst, p.MaxCost, p.DedupeTTL, p.DedupeMax = f.Revision, f.Burst, f.MaxCost, f.DedupeTTL, f.DedupeMax
	p.LocalQuota.BlockTime, p.LocalQuota.MaxBlock, p.MaxWait = f.BlockTime, f.MaxBlock, f.MaxWait
	return p
}

// Validate reports the first field of p (after defaults) that breaks a
// rule, naming the policy, the field, the value and the rule, e.g.
// `sluice: policy "api": limit = 0: must be between 1 and 1000000000`.
// The rules are policyform.go's.
func (p Policy) Validate() error {
	maxCost := p.MaxCost
	p = p.withDefaults()
	bad := func(field, value, rule string) error {
		return &policyerr.Error{Policy: p.ID, Field: field, Value: value, Rule: rule}
	}
	if err := checkPolicy(&p, maxCost, bad); err != nil {
		return err
	}
	return algorithm.CheckShares(p.Priorities, p.params().Capacity(algorithm.Kind(p.Algorithm)), bad)
}

// reserves reports whether p holds part of its capacity back from a
// request of class (Priorities): such a request bypasses the near cache
// (a denial of one class says nothing of another, and its retry time is
// another's) and local quota (a block serves requests of every class).
func (p *Policy) reserves(class string) bool {
	return len(p.Priorities) > 0 && algorithm.ShareOf(p.Priorities, class) < 100
}

// params returns p's numbers in the engine's units (a calendar period's
// nominal length for its window).
func (p Policy) params() algorithm.Params {
	f := p.fields()
	if u, ok := period.Parse(p.Period); ok {
		f.Window = u.Nominal()
	}
	return f.Params()
}
