// Package evaluation is what every store of this module does around the
// decision engine of internal/algorithm: a sluice.Policy in the engine's
// terms, the engine's decision as a sluice.Status, a sluice.Clock's time in
// the engine's unit.
package evaluation

import (
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algorithm"
)

// Policy returns p's algorithm and numbers in the engine's units.
func Policy(p *sluice.Policy) algorithm.Policy {
	return algorithm.Policy{
		Kind:   algorithm.Kind(p.Algorithm),
		Params: algorithm.Params{Limit: p.Limit, Window: Window(p), Burst: p.Burst},
	}
}

// Window returns the period p's math runs on, µs: its Window, or for
// concurrency its LeaseTTL (how long a lease lives).
func Window(p *sluice.Policy) int64 {
	if p.Algorithm == sluice.Concurrency {
		return p.LeaseTTL.Microseconds()
	}
	return p.Window.Microseconds()
}

// Status returns d, a decision of p, as a Status.
func Status(p *sluice.Policy, d algorithm.Decision) sluice.Status {
	return sluice.Status{
		Policy:      p.ID,
		Allowed:     d.Allowed,
		Limit:       d.Limit,
		Remaining:   d.Remaining,
		ResetAfter:  time.Duration(d.ResetAfter) * time.Microsecond,
		RetryAfter:  time.Duration(d.RetryAfter) * time.Microsecond,
		Approximate: p.Algorithm.Approximate(),
	}
}

// Now returns c's time in integer microseconds since the Unix epoch, the
// engine's time unit. A clock with a UnixMicro method of its own
// (sluice.MonotonicClock) is asked directly.
func Now(c sluice.Clock) int64 {
	if m, ok := c.(interface{ UnixMicro() int64 }); ok {
		return m.UnixMicro()
	}
	return c.Now().UnixMicro()
}
