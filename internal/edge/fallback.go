package edge

import (
	"errors"
	"fmt"
	"math"

	"github.com/sluicehq/sluice"
)

// localFallback returns the Limiter over store holding share of each of
// l's policies, under the same IDs: what a rule failing local decides on
// while l cannot.
func localFallback(l *sluice.Limiter, store sluice.Store, share float64) (*sluice.Limiter, error) {
	if l == nil {
		return nil, errors.New("the limiter has no policies to share")
	}
	var local []sluice.Policy
	for _, id := range l.Policies() {
		p, _ := l.Policy(id)
		local = append(local, scale(p, share))
	}
	fl, err := sluice.New(store, local, sluice.Options{})
	if err != nil {
		return nil, fmt.Errorf("local fallback: %w", err)
	}
	return fl, nil
}

// scale returns p holding share of its limit: Limit (and Burst, for
// token_bucket and gcra) scaled and rounded down, at least 1; MaxCost
// capped at the new capacity.
func scale(p sluice.Policy, share float64) sluice.Policy {
	part := func(n int64) int64 { return max(1, int64(math.Floor(float64(n)*share))) }
	p.Limit = part(p.Limit)
	capacity := p.Limit
	if p.Algorithm == sluice.TokenBucket || p.Algorithm == sluice.GCRA {
		p.Burst = part(p.Burst)
		capacity = p.Burst
	} else {
		p.Burst = 0
	}
	p.MaxCost = min(p.MaxCost, capacity)
	// In the process, a share of the limit: nothing to spare store calls of.
	p.LocalQuota, p.NearCache = sluice.LocalQuota{}, false
	return p
}
