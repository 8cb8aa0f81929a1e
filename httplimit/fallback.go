package httplimit

import (
	"fmt"
	"math"

	"github.com/sluicehq/sluice"
)

// localFallback returns the Limiter over store holding share of each of
// l's policies whose failure mode is FailLocal, under the same IDs (see
// Options.Fallback and LocalShare).
func localFallback(l *sluice.Limiter, store sluice.Store, share float64) (*sluice.Limiter, error) {
	if !(share > 0 && share <= 1) {
		return nil, optionError("LocalShare", share, "must be in (0, 1]")
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
		return nil, optionError("Fallback", "set", "the limiter has no policy whose failure mode is local")
	}
	fl, err := sluice.New(store, local, sluice.Options{})
	if err != nil {
		return nil, fmt.Errorf("httplimit: local fallback: %w", err)
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
