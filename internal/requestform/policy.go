package requestform

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/period"
	"github.com/sluicehq/sluice/internal/policydefaults"
)

// PolicyForm is what Policy checks of a sluice.Policy: its defaulted
// fields, the fields no default touches, and MaxCost as it was set.
type PolicyForm struct {
	policydefaults.Fields
	ID           string
	Period       string
	TimeZone     *time.Location
	NearCache    bool
	CleanupGrace time.Duration
	SetMaxCost   int64 // before defaults: 0 when unset
}

// Params returns f's numbers in the engine's units; a calendar period is
// checked as a window of its nominal length (a store decides on the
// calendar's).
func (f *PolicyForm) Params() algorithm.Params {
	w := f.Fields
	if u, ok := period.Parse(f.Period); ok {
		w.Window = u.Nominal()
	}
	return w.Params()
}

// Policy reports, through bad (field, value as written, rule), the first
// rule a policy breaks (sluice.Policy's comments state them; Validate is
// this, with defaults applied).
func Policy(f PolicyForm, bad func(field, value, rule string) error) error {
	name := f.Kind.String()
	switch {
	case !PolicyID(f.ID):
		return bad("id", fmt.Sprintf("%q", f.ID), "must be 1 to 64 characters of A-Z a-z 0-9 _ . -")
	case f.Revision < 1 || f.Revision > 1<<31:
		return bad("revision", fmt.Sprint(f.Revision), "must be between 1 and 2147483648")
	case f.Kind < algorithm.KindFixedWindow || f.Kind > algorithm.KindConcurrency:
		return bad("algorithm", fmt.Sprintf("Algorithm(%d)", uint8(f.Kind)), "must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency")
	}
	if field, value, rule := period.CheckPolicy(f.Period, f.TimeZone, name, f.Window, f.Aligned, f.LocalQuota); field != "" {
		return bad(field, value, rule)
	}
	if err := leaseRules(f, bad); err != nil {
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
	prm := f.Params()
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
	case f.CleanupGrace < 0 || f.CleanupGrace > time.Hour:
		return bad("cleanup_grace", f.CleanupGrace.String(), "must be between 0s and 1h")
	case f.DedupeTTL < time.Millisecond || f.DedupeTTL > time.Hour || f.DedupeTTL%time.Millisecond != 0:
		return bad("dedupe_ttl", f.DedupeTTL.String(), "must be a whole number of milliseconds between 1ms and 1h")
	case f.DedupeMax < 1 || f.DedupeMax > 10000:
		return bad("dedupe_max", fmt.Sprint(f.DedupeMax), "must be between 1 and 10000")
	}
	if err := waitRules(f, prm, bad); err != nil {
		return err
	}
	return LocalQuota(f.Fields, bad)
}

// waitRules is Policy's part for a Book's bound: max_wait only on the
// bucket algorithms, a whole number of µs from 0 to the engine's most
// (algorithm.MostWait). prm are f's numbers, already checked.
func waitRules(f PolicyForm, prm algorithm.Params, bad func(field, value, rule string) error) error {
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
// lease_ttl and what does not apply to it, and no lease_ttl elsewhere.
func leaseRules(f PolicyForm, bad func(field, value, rule string) error) error {
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
	case f.SetMaxCost != 0 && f.SetMaxCost != f.Limit: // Limit: the default, as Limiter.Policy reports it
		return bad("max_cost", fmt.Sprint(f.SetMaxCost), "does not apply to concurrency: a lease holds one slot whatever the cost")
	case f.NearCache:
		return bad("near_cache", "true", "does not apply to concurrency: a release frees a slot before a denial's retry time")
	}
	return nil
}
