// Package policydefaults fills in a policy's defaulted fields: the one
// place the defaults are decided (sluice.Policy's field comments state
// them). It works on Fields, the numbers of a sluice.Policy that defaults
// depend on or set, so that the root package (which calls it for every
// policy a Limiter takes) can import it; packages above the root reach it
// through evaluation.Defaults.
package policydefaults

import (
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// MinBlock is the fewest units a block of local quota holds: below that,
// a block saves too few store calls to be worth its unspent units.
const MinBlock = 4

// Fields are a policy's defaulted fields and what their defaults depend
// on, in sluice.Policy's units.
type Fields struct {
	Kind      algorithm.Kind
	Limit     int64
	Window    time.Duration
	LeaseTTL  time.Duration
	Aligned   bool
	Revision  int64
	Burst     int64
	MaxCost   int64
	DedupeTTL time.Duration
	DedupeMax int
	// LocalQuota is LocalQuota.Enabled; BlockTime and MaxBlock its fields.
	LocalQuota bool
	BlockTime  time.Duration
	MaxBlock   int64
	// MaxWait is the longest a Book may wait for its slot (token_bucket
	// and gcra only).
	MaxWait time.Duration
}

// Params returns f's numbers in the engine's units.
func (f *Fields) Params() algorithm.Params {
	w := f.Window
	if f.Kind == algorithm.KindConcurrency {
		w = f.LeaseTTL // the engine's window: how long a lease lives
	}
	return algorithm.Params{Limit: f.Limit, Window: w.Microseconds(), Burst: f.Burst, Aligned: f.Aligned}
}

// Apply fills in every defaulted zero field of f. It does not validate.
func Apply(f *Fields) {
	if f.Revision == 0 {
		f.Revision = 1
	}
	if f.Burst == 0 {
		f.Burst = f.Limit
	}
	if f.MaxCost == 0 {
		f.MaxCost = f.Params().Capacity(f.Kind)
	}
	if f.DedupeTTL == 0 {
		f.DedupeTTL = 5 * time.Second
	}
	if f.DedupeMax == 0 {
		f.DedupeMax = 256
	}
	if f.MaxWait == 0 && (f.Kind == algorithm.KindTokenBucket || f.Kind == algorithm.KindGCRA) && f.Limit >= 1 && f.Window >= time.Microsecond {
		f.MaxWait = DefaultMaxWait(f.Params())
	}
	if !f.LocalQuota {
		return
	}
	if f.BlockTime == 0 {
		f.BlockTime = min(100*time.Millisecond, f.Window/10)
		if f.Kind == algorithm.KindTokenBucket || f.Kind == algorithm.KindGCRA {
			f.BlockTime = min(f.BlockTime, Refill(f.Limit, f.Window, f.Burst/8))
		}
		f.BlockTime = max(f.BlockTime.Truncate(time.Microsecond), time.Millisecond) // Validate says when even that is too long
	}
	if f.MaxBlock == 0 {
		f.MaxBlock = max(f.MaxCost/10, MinBlock)
	}
}

// Refill returns how long a token_bucket or gcra bucket of limit per
// window takes to refill n units, rounded down to a microsecond.
func Refill(limit int64, window time.Duration, n int64) time.Duration {
	if limit <= 0 {
		return 0
	}
	return time.Duration(n*window.Microseconds()/limit) * time.Microsecond
}

// DefaultMaxWait is a bucket's MaxWait when none is set: its window (the
// units booked ahead are then at most a window's refill, Limit), at most
// a minute, and at most what keeps the units booked ahead exact
// (algorithm.MostWait).
func DefaultMaxWait(p algorithm.Params) time.Duration {
	return min(time.Duration(p.Window)*time.Microsecond, time.Minute, time.Duration(algorithm.MostWait(p))*time.Microsecond)
}
