package rlqs

import "testing"

// TestPlanRaisesAStreamShortOfItsDemand: hysteresis holds an assignment
// within 10 % of its target, but not one below its target while the
// stream asks for more than it has: such a stream spends its whole
// assignment (its Envoy's bucket is empty, so the change costs it no
// tokens and adds no jump), and holding it back leaves up to 10 % of the
// limit unused while demand exceeds it. The fleet tests saw it: a raise
// scaled down by the round's room (fitUp) then held there for good,
// 89 % of the limit admitted with 4 proxies over it.
func TestPlanRaisesAStreamShortOfItsDemand(t *testing.T) {
	p := share{rate: 100_000, burst: 100_000}
	for _, c := range []struct {
		name   string
		demand int64
		raised bool
	}{
		{"short of its demand, 5 % below its target: raised", 1_000_000, true},
		{"using less than it has, 5 % below its target: held", 50_000, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// One stream alone: its target is r·(1 − φ) = 93.75 %.
			tgt := target(p, 1, c.demand, c.demand)
			h := &hold{demand: c.demand, assigned: share{tgt.rate * 95 / 100, tgt.burst * 95 / 100}}
			_, want := plan(p, 1, c.demand, []*hold{h})
			if got := want[0] == tgt; got != c.raised {
				t.Fatalf("assigned %+v, target %+v, demand %d: plan wants %+v; raised = %v, want %v", h.assigned, tgt, c.demand, want[0], got, c.raised)
			}
		})
	}
}
