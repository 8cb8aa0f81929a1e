package localquota

import (
	"sync"
	"sync/atomic"
)

// Stats is what local quota did for one policy: the sums of a Hook's
// deltas.
type Stats struct {
	// Local is the requests admitted from blocks, without a store call.
	Local int64
	// Blocks is the blocks taken, one store call each.
	Blocks int64
	// Units is the units the blocks took from the store.
	Units int64
	// Unused is the units of blocks whose time ran out before they were
	// admitted (or that were dropped): spent in the store, admitted to
	// nobody.
	Unused int64
}

// Add returns s plus t, field by field.
func (s Stats) Add(t Stats) Stats {
	return Stats{Local: s.Local + t.Local, Blocks: s.Blocks + t.Blocks, Units: s.Units + t.Units, Unused: s.Unused + t.Unused}
}

// Tally sums the deltas its Add is told, per policy: the Hook
// (sluice.Options.OnLocalQuota) of a Limiter whose owner reads what local
// quota did, the server's metrics and tests. The zero value is empty and
// ready. Safe for concurrent use.
type Tally struct {
	m sync.Map // policy ID → *counters
}

type counters struct{ local, blocks, units, unused atomic.Int64 }

// Add adds one policy's deltas: a Hook.
func (t *Tally) Add(policy string, local, blocks, units, unused int64) {
	v, ok := t.m.Load(policy)
	if !ok {
		v, _ = t.m.LoadOrStore(policy, new(counters))
	}
	c := v.(*counters)
	if local != 0 {
		c.local.Add(local)
	}
	if blocks != 0 {
		c.blocks.Add(blocks)
	}
	if units != 0 {
		c.units.Add(units)
	}
	if unused != 0 {
		c.unused.Add(unused)
	}
}

// Stats returns the sums for policy: all zero for one never told.
func (t *Tally) Stats(policy string) Stats {
	v, ok := t.m.Load(policy)
	if !ok {
		return Stats{}
	}
	c := v.(*counters)
	return Stats{Local: c.local.Load(), Blocks: c.blocks.Load(), Units: c.units.Load(), Unused: c.unused.Load()}
}

// Range calls f with the sums of every policy told so far.
func (t *Tally) Range(f func(policy string, s Stats)) {
	t.m.Range(func(k, _ any) bool {
		f(k.(string), t.Stats(k.(string)))
		return true
	})
}
