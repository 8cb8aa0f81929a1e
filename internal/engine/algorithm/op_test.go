package algorithm

import (
	"errors"
	"testing"
)

// TestCheckOp: each operation's rules, one row a rule.
func TestCheckOp(t *testing.T) {
	rate := Policy{Kind: KindFixedWindow, Params: Params{Limit: 5, Window: sec, Burst: 5}, ID: "rate", MaxCost: 5}
	estimate := Policy{Kind: KindSlidingWindow, Params: Params{Limit: 5, Window: sec, Burst: 5}, ID: "estimate", MaxCost: 5}
	conc := Policy{Kind: KindConcurrency, Params: Params{Limit: 2, Window: sec, Burst: 2}, ID: "conc"}
	for _, c := range []struct {
		name       string
		op         Op
		policies   []Policy
		cost       int64
		lease      string
		remembered bool
		want       error // nil: allowed
	}{
		{"spend", OpSpend, []Policy{rate}, 5, "", true, nil},
		{"spend of no cost", OpSpend, []Policy{rate}, 0, "", false, ErrInvalidRequest},
		{"spend above max cost", OpSpend, []Policy{rate}, 6, "", false, ErrCostTooHigh},
		{"spend on concurrency", OpSpend, []Policy{rate, conc}, 1, "", false, ErrInvalidRequest},
		{"spend with a lease", OpSpend, []Policy{rate}, 1, "l", false, ErrInvalidRequest},
		{"no policy", OpSpend, nil, 1, "", false, ErrInvalidRequest},
		{"unknown operation", Op(99), []Policy{rate}, 1, "", false, ErrInvalidRequest},
		{"peek", OpPeek, []Policy{rate, conc, estimate}, 0, "", true, nil},
		{"peek with a cost", OpPeek, []Policy{rate}, 1, "", false, ErrInvalidRequest},
		{"refund", OpRefund, []Policy{rate}, 2, "", true, nil},
		{"refund of sliding_window", OpRefund, []Policy{rate, estimate}, 1, "", false, ErrNotRefundable},
		{"refund of concurrency", OpRefund, []Policy{conc}, 1, "", false, ErrNotRefundable},
		{"refund of no cost", OpRefund, []Policy{rate}, 0, "", false, ErrInvalidRequest},
		{"reset", OpReset, []Policy{rate, conc, estimate}, 0, "", false, nil},
		{"reset with a cost", OpReset, []Policy{rate}, 1, "", false, ErrInvalidRequest},
		{"reset with an evaluation id", OpReset, []Policy{rate}, 0, "", true, ErrInvalidRequest},
		{"acquire", OpAcquire, []Policy{rate, conc}, 3, "l", true, nil},
		{"acquire above a rate policy's max cost", OpAcquire, []Policy{rate, conc}, 6, "l", false, ErrCostTooHigh},
		{"acquire without concurrency", OpAcquire, []Policy{rate}, 1, "l", false, ErrInvalidRequest},
		{"acquire without a lease", OpAcquire, []Policy{conc}, 1, "", false, ErrInvalidRequest},
		{"release", OpRelease, []Policy{conc}, 0, "l", false, nil},
		{"release of a rate policy", OpRelease, []Policy{conc, rate}, 0, "l", false, ErrInvalidRequest},
		{"release with a cost", OpRelease, []Policy{conc}, 1, "l", false, ErrInvalidRequest},
		{"release with an evaluation id", OpRelease, []Policy{conc}, 0, "l", true, ErrInvalidRequest},
		{"renew", OpRenew, []Policy{conc}, 0, "l", false, nil},
		{"renew without a lease", OpRenew, []Policy{conc}, 0, "", false, ErrInvalidRequest},
	} {
		err := Check(c.op, c.policies, c.cost, c.lease, c.remembered)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: Check(%v, cost=%d, lease=%q) = %v, want %v", c.name, c.op, c.cost, c.lease, err, c.want)
		}
	}
}
