package requestform

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policydefaults"
)

// LocalQuota reports, through bad (field, value as written, rule), the
// first rule a policy's local quota breaks, f its fields with defaults
// applied (sluice.Policy.LocalQuota's comments state the rules).
func LocalQuota(f policydefaults.Fields, bad func(field, value, rule string) error) error {
	if !f.LocalQuota {
		if f.BlockTime != 0 || f.MaxBlock != 0 {
			return bad("local_quota.enabled", "false", "must be true when block_time or max_block is set")
		}
		return nil
	}
	switch f.Kind {
	case algorithm.KindSlidingWindow:
		return bad("local_quota", "true", "does not apply to sliding_window: its estimate weighs each unit by the window it was spent in, and a block's units would be used after the store counted them")
	case algorithm.KindSlidingLog:
		return bad("local_quota", "true", "does not apply to sliding_log: a block's entries would have to be dated after the log's newest write; use gcra or token_bucket for a hot subject")
	case algorithm.KindConcurrency:
		return bad("local_quota", "true", "does not apply to concurrency: a lease is held, not spent")
	}
	longest, rule := min(time.Second, f.Window/2), "must be between 1ms and 1s, at most half the window"
	if f.Kind == algorithm.KindTokenBucket || f.Kind == algorithm.KindGCRA {
		longest, rule = min(longest, policydefaults.Refill(f.Limit, f.Window, f.Burst/2)), rule+" and the time to refill half the burst"
	}
	if longest < time.Millisecond {
		return bad("local_quota", "true", fmt.Sprintf("needs blocks of at least 1ms, and this policy allows them at most %v (half the window, or for token_bucket and gcra the time to refill half the burst)", longest))
	}
	if f.BlockTime < time.Millisecond || f.BlockTime > longest || f.BlockTime%time.Microsecond != 0 {
		return bad("local_quota.block_time", f.BlockTime.String(), fmt.Sprintf("%s (%v), a whole number of microseconds", rule, longest))
	}
	const minBlock = policydefaults.MinBlock
	if half := f.MaxCost / 2; half < minBlock {
		return bad("local_quota", "true", fmt.Sprintf("needs a max_cost of at least %d, not %d: a limit this small is best decided by the store, one request at a time", 2*minBlock, f.MaxCost))
	} else if f.MaxBlock < minBlock || f.MaxBlock > half {
		return bad("local_quota.max_block", fmt.Sprint(f.MaxBlock), fmt.Sprintf("must be between %d and %d, half of max_cost", minBlock, half))
	}
	return nil
}
