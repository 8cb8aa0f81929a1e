package algorithm

import (
	"errors"
	"strings"
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
		err := Check(c.op, c.policies, c.cost, 0, c.lease, c.remembered)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: Check(%v, cost=%d, lease=%q) = %v, want %v", c.name, c.op, c.cost, c.lease, err, c.want)
		}
	}
}

// TestCheckHold: where a held spend may go, one row a rule; a refused
// one names the hold and the rule it broke.
func TestCheckHold(t *testing.T) {
	fixed := Policy{Kind: KindFixedWindow, Params: Params{Limit: 5, Window: sec, Burst: 5}, ID: "fixed", MaxCost: 5}
	bucket := Policy{Kind: KindTokenBucket, Params: Params{Limit: 10, Window: sec, Burst: 5}, ID: "bucket", MaxCost: 5}
	gcra := Policy{Kind: KindGCRA, Params: Params{Limit: 10, Window: sec, Burst: 20}, ID: "gcra", MaxCost: 20}
	log := Policy{Kind: KindSlidingLog, Params: Params{Limit: 5, Window: sec, Burst: 5}, ID: "log", MaxCost: 5}
	estimate := Policy{Kind: KindSlidingWindow, Params: Params{Limit: 5, Window: sec, Burst: 5}, ID: "estimate", MaxCost: 5}
	for _, c := range []struct {
		name       string
		op         Op
		policies   []Policy
		cost, hold int64
		remembered bool
		want       string // "": allowed; else a part of the error
	}{
		{"fixed_window", OpHold, []Policy{fixed}, 5, 1, false, ""},
		{"fixed_window for a whole window", OpHold, []Policy{fixed}, 5, sec, false, ""},
		{"fixed_window beyond its window", OpHold, []Policy{fixed}, 1, sec + 1, false, "hold = 1000001µs: must be at most the window, 1000000µs"},
		{"token_bucket for the time to refill the burst", OpHold, []Policy{bucket}, 1, sec / 2, false, ""},
		{"token_bucket beyond it", OpHold, []Policy{bucket}, 1, sec/2 + 1, false, "hold = 500001µs: must be at most the time the rate takes to refill the burst, 500000µs"},
		{"gcra for a window", OpHold, []Policy{gcra}, 20, sec, false, ""},
		{"gcra beyond its window", OpHold, []Policy{gcra}, 1, sec + 1, false, "must be at most the window"},
		{"negative", OpHold, []Policy{gcra}, 1, -1, false, "hold = -1µs: a held spend holds for 1µs or more"},
		{"no hold", OpHold, []Policy{gcra}, 1, 0, false, "hold = 0µs: a held spend holds for 1µs or more"},
		{"a spend", OpSpend, []Policy{gcra}, 1, 10, false, "only a held spend (hold) is held, not a spend"},
		{"a peek", OpPeek, []Policy{gcra}, 0, 10, false, "only a held spend (hold) is held, not a peek"},
		{"a refund", OpRefund, []Policy{gcra}, 1, 10, false, "only a held spend (hold) is held, not a refund"},
		{"two policies", OpHold, []Policy{gcra, fixed}, 1, 10, false, "names exactly one policy, not 2"},
		{"an evaluation id", OpHold, []Policy{gcra}, 1, 10, true, "takes no evaluation id"},
		{"sliding_window", OpHold, []Policy{estimate}, 1, 10, false, `policy "estimate": invalid request: hold = 10µs: sliding_window takes no held spend: its estimate weighs a unit by when it was spent`},
		{"sliding_log", OpHold, []Policy{log}, 1, 10, false, "sliding_log takes no held spend: a block's entries would have to be dated ahead of the log's newest write"},
		{"above max cost", OpHold, []Policy{fixed}, 6, 10, false, "cost above policy maximum"},
		{"a 24h window at the most limit", OpHold, []Policy{{Kind: KindGCRA, Params: Params{Limit: MaxLimit, Window: 86_400_000_000, Burst: 1}, ID: "huge", MaxCost: 1}}, 1, 86_400_000_000, false,
			"must be at most the time the rate takes to refill the burst, 86µs"},
	} {
		err := Check(c.op, c.policies, c.cost, c.hold, "", c.remembered)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: Check(%v, cost=%d, hold=%d) = %v, want nil", c.name, c.op, c.cost, c.hold, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: Check(%v, cost=%d, hold=%d) = %v, want an error holding %q", c.name, c.op, c.cost, c.hold, err, c.want)
		case c.want != "" && !errors.Is(err, ErrInvalidRequest) && !errors.Is(err, ErrCostTooHigh):
			t.Errorf("%s: Check(%v, cost=%d, hold=%d) = %v, want ErrInvalidRequest", c.name, c.op, c.cost, c.hold, err)
		}
	}
}
