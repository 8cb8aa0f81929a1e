package httplimit

import (
	"errors"
	"fmt"
	"math"

	"github.com/sluicehq/sluice"
)

// LocalFallback returns a Limiter over store (typically a memstore.Store
// of this process) holding share of each of l's policies whose failure
// mode is FailLocal, under the same IDs: Limit (and Burst, for
// token_bucket and gcra) scaled by share and rounded down, at least 1;
// MaxCost capped at the new capacity. Pass it as Options.Fallback.
//
// With n instances of an application, share 1/n makes an outage of the
// shared store degrade to approximately the configured limit instead of
// to no limit. share must be in (0, 1]. The caller owns store and closes
// it.
func LocalFallback(l *sluice.Limiter, store sluice.Store, share float64, opts sluice.Options) (*sluice.Limiter, error) {
	if l == nil {
		return nil, errors.New("httplimit: LocalFallback: limiter is nil")
	}
	if !(share > 0 && share <= 1) {
		return nil, fmt.Errorf("httplimit: LocalFallback: share %v: must be in (0, 1]", share)
	}
	var local []sluice.Policy
	for _, id := range l.Policies() {
		p, _ := l.Policy(id)
		if p.FailureMode != sluice.FailLocal {
			continue
		}
		local = append(local, scale(p, share))
	}
	if len(local) == 0 {
		return nil, errors.New("httplimit: LocalFallback: the limiter has no policy whose failure mode is local")
	}
	fl, err := sluice.New(store, local, opts)
	if err != nil {
		return nil, fmt.Errorf("httplimit: LocalFallback: %w", err)
	}
	return fl, nil
}

// scale returns p holding share of its limit.
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
	return p
}
