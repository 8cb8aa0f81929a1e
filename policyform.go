package sluice

// policyform.go holds the rules of a Policy (Validate) and of its local
// quota, each reported through a function that names the field, the value
// as written and the rule.

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/period"
	"github.com/sluicehq/sluice/internal/policydefaults"
)

// checkPolicy reports, through bad (field, value as written, rule), the
// first rule p, with defaults applied, breaks (Policy's comments state
// them; Validate is this); setMaxCost is its MaxCost as it was set (0:
// unset).
func checkPolicy(p *Policy, setMaxCost int64, bad func(field, value, rule string) error) error {
	f := p.fields()
	name := f.Kind.String()
	switch {
	case !validPolicyID(p.ID):
		return bad("id", fmt.Sprintf("%q", p.ID), "must be 1 to 64 characters of A-Z a-z 0-9 _ . -")
	case f.Revision < 1 || f.Revision > 1<<31:
		return bad("revision", fmt.Sprint(f.Revision), "must be between 1 and 2147483648")
	case f.Kind < algorithm.KindFixedWindow || f.Kind > algorithm.KindConcurrency:
		return bad("algorithm", fmt.Sprintf("Algorithm(%d)", uint8(f.Kind)), "must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency")
	}
	if field, value, rule := period.CheckPolicy(p.Period, p.TimeZone, name, f.Window, f.Aligned, f.LocalQuota); field != "" {
		return bad(field, value, rule)
	}
	if err := leaseRules(p, f, setMaxCost, bad); err != nil {
		return err
	}
	switch {
	case f.Window%time.Microsecond != 0:
		return bad("window", f.Window.String(), "must be a whole number of microseconds")
	case f.Burst != f.Limit && f.Kind != algorithm.KindTokenBucket && f.Kind != algorithm.KindGCRA:
		return bad("burst", fmt.Sprint(f.Burst), "applies only to token_bucket and gcra; leave it unset for "+name)
	case f.Aligned && f.Kind != algorithm.KindFixedWindow:
		return bad("align", "clock", "applies only to fixed_window, the one algorithm with windows to align; leave it unset for "+name)
	}
	prm := p.params()
	if err := prm.Check(f.Kind); err != nil {
		re := err.(*algorithm.RangeError)
		value := fmt.Sprint(re.Value)
		switch {
		case re.Field == "window" && f.Kind == algorithm.KindConcurrency:
			re.Field, value = "lease_ttl", f.LeaseTTL.String()
		case re.Field == "window":
			value = f.Window.String()
		}
		return bad(re.Field, value, re.Rule)
	}
	switch capacity := prm.Capacity(f.Kind); {
	case f.MaxCost < 1 || f.MaxCost > capacity:
		return bad("max_cost", fmt.Sprint(f.MaxCost), fmt.Sprintf("must be between 1 and %d, the most %s can admit at once", capacity, name))
	case p.CleanupGrace < 0 || p.CleanupGrace > time.Hour:
		return bad("cleanup_grace", p.CleanupGrace.String(), "must be between 0s and 1h")
	case f.DedupeTTL < time.Millisecond || f.DedupeTTL > time.Hour || f.DedupeTTL%time.Millisecond != 0:
		return bad("dedupe_ttl", f.DedupeTTL.String(), "must be a whole number of milliseconds between 1ms and 1h")
	case f.DedupeMax < 1 || f.DedupeMax > 10000:
		return bad("dedupe_max", fmt.Sprint(f.DedupeMax), "must be between 1 and 10000")
	}
	if err := waitRules(f, prm, bad); err != nil {
		return err
	}
	return checkLocalQuota(f, bad)
}

// waitRules is Policy's part for a Book's bound: max_wait only on the
// bucket algorithms, a whole number of µs from 0 to the engine's most
// (algorithm.MostWait). prm are f's numbers, already checked.
func waitRules(f policydefaults.Fields, prm algorithm.Params, bad func(field, value, rule string) error) error {
	bucket := f.Kind == algorithm.KindTokenBucket || f.Kind == algorithm.KindGCRA
	switch most := time.Duration(algorithm.MostWait(prm)) * time.Microsecond; {
	case f.MaxWait == 0:
	case !bucket:
		return bad("max_wait", f.MaxWait.String(), "applies only to token_bucket and gcra, which have a future slot to book; leave it unset for "+f.Kind.String())
	case f.MaxWait%time.Microsecond != 0:
		return bad("max_wait", f.MaxWait.String(), "must be a whole number of microseconds")
	case f.MaxWait < 0 || f.MaxWait > most:
		return bad("max_wait", f.MaxWait.String(), fmt.Sprintf("must be between 0s and %v (at most 24h, and the units booked ahead must stay exact below 2^53)", most))
	}
	return nil
}

// leaseRules is Policy's part for leases: a concurrency policy's
// lease_ttl and what does not apply to it, and no lease_ttl elsewhere; f
// are p's defaulted fields, setMaxCost its MaxCost as set.
func leaseRules(p *Policy, f policydefaults.Fields, setMaxCost int64, bad func(field, value, rule string) error) error {
	if f.Kind != algorithm.KindConcurrency {
		if f.LeaseTTL != 0 {
			return bad("lease_ttl", f.LeaseTTL.String(), "applies only to concurrency; leave it unset for "+f.Kind.String())
		}
		return nil
	}
	switch {
	case f.Window != 0:
		return bad("window", f.Window.String(), "does not apply to concurrency, which limits leases held at once; set lease_ttl, how long a lease lives if never released")
	case f.LeaseTTL <= 0:
		return bad("lease_ttl", f.LeaseTTL.String(), "must be between 1ms and 24h: concurrency requires it, how long a lease lives if never released")
	case f.LeaseTTL%time.Microsecond != 0:
		return bad("lease_ttl", f.LeaseTTL.String(), "must be a whole number of microseconds")
	case setMaxCost != 0 && setMaxCost != f.Limit: // Limit: the default, as Limiter.Policy reports it
		return bad("max_cost", fmt.Sprint(setMaxCost), "does not apply to concurrency: a lease holds one slot whatever the cost")
	case p.NearCache:
		return bad("near_cache", "true", "does not apply to concurrency: a release frees a slot before a denial's retry time")
	}
	return nil
}

// checkLocalQuota reports, through bad (field, value as written, rule),
// the first rule a policy's local quota breaks, f its fields with
// defaults applied (Policy.LocalQuota's comments state the rules).
func checkLocalQuota(f policydefaults.Fields, bad func(field, value, rule string) error) error {
	if !f.LocalQuota {
		if f.BlockTime != 0 || f.MaxBlock != 0 {
			return bad("local_quota.enabled", "false", "must be true when block_time or max_block is set")
		}
		return nil
	}
	switch f.Kind {
	case algorithm.KindSlidingWindow:
		return bad("local_quota", "true", "does not apply to sliding_window: its estimate weighs each unit by the window it was spent in, and a block's units would be used after the store counted them")
	case algorithm.KindSlidingLog:
		return bad("local_quota", "true", "does not apply to sliding_log: a block's entries would have to be dated after the log's newest write; use gcra or token_bucket for a hot subject")
	case algorithm.KindConcurrency:
		return bad("local_quota", "true", "does not apply to concurrency: a lease is held, not spent")
	}
	longest, rule := min(time.Second, f.Window/2), "must be between 1ms and 1s, at most half the window"
	if f.Kind == algorithm.KindTokenBucket || f.Kind == algorithm.KindGCRA {
		longest, rule = min(longest, policydefaults.Refill(f.Limit, f.Window, f.Burst/2)), rule+" and the time to refill half the burst"
	}
	if longest < time.Millisecond {
		return bad("local_quota", "true", fmt.Sprintf("needs blocks of at least 1ms, and this policy allows them at most %v (half the window, or for token_bucket and gcra the time to refill half the burst)", longest))
	}
	if f.BlockTime < time.Millisecond || f.BlockTime > longest || f.BlockTime%time.Microsecond != 0 {
		return bad("local_quota.block_time", f.BlockTime.String(), fmt.Sprintf("%s (%v), a whole number of microseconds", rule, longest))
	}
	const minBlock = policydefaults.MinBlock
	if half := f.MaxCost / 2; half < minBlock {
		return bad("local_quota", "true", fmt.Sprintf("needs a max_cost of at least %d, not %d: a limit this small is best decided by the store, one request at a time", 2*minBlock, f.MaxCost))
	} else if f.MaxBlock < minBlock || f.MaxBlock > half {
		return bad("local_quota.max_block", fmt.Sprint(f.MaxBlock), fmt.Sprintf("must be between %d and %d, half of max_cost", minBlock, half))
	}
	return nil
}
