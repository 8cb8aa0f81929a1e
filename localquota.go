package sluice

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/localquota"
)

// localQuota is local quota's stage (Policy.LocalQuota) over
// internal/localquota's blocks, whose package doc proves the bound: it
// hands them the policy's numbers and the store's answers in the
// engine's terms, and builds the Status of an admission from a block.
type localQuota struct {
	q *localquota.Quota
}

func newLocalQuota(c Clock, hook localquota.Hook) *localQuota {
	return &localQuota{q: localquota.New(c, hook)}
}

// do is local quota's stage. A Spend of one LocalQuota policy (the
// subject's own numbers: an override too small for blocks has none),
// named by Request.Policy, with no evaluation id or older subject, of a
// cost within MaxCost, is answered by localquota.Quota.Spend: from the
// subject's block, by taking a block, or by the store as it came. A Reset
// drops the subject's blocks under its policies.
func (lq *localQuota) do(ctx context.Context, d *decision, next step) {
	ev := &d.ev
	if ev.Op == Reset {
		for _, p := range ev.Policies {
			lq.q.Forget(ev.Subject, p.ID)
		}
	}
	if ev.Op != Spend || d.many || len(ev.Policies) != 1 || !ev.Policies[0].LocalQuota.Enabled || ev.EvaluationID != "" || len(ev.Previous) > 0 || ev.Cost < 1 || ev.Cost > ev.Policies[0].MaxCost || ev.Policies[0].reserves(ev.Priority) {
		next(ctx, d)
		return
	}
	p, cost := ev.Policies[0], ev.Cost
	n := localquota.Numbers{ID: p.ID, Kind: algorithm.Kind(p.Algorithm), Limit: p.Limit, Window: p.Window, Burst: p.Burst,
		BlockTime: p.LocalQuota.BlockTime, MaxBlock: p.LocalQuota.MaxBlock}
	r := lq.q.Spend(ctx, ev.Subject, &n, cost, func(k int64, hold time.Duration) localquota.Answer {
		ev.Cost, ev.Hold = k, hold
		next(ctx, d)
		ev.Cost, ev.Hold = cost, 0
		a := localquota.Answer{Limit: d.o.Limit, Remaining: d.o.Remaining, ResetAfter: d.o.ResetAfter, RetryAfter: d.o.RetryAfter}
		switch d.o.Kind {
		case Allowed:
			a.Kind = localquota.Allowed
		case Denied:
			a.Kind = localquota.Denied
		}
		return a
	})
	switch {
	case r.Err != nil:
		d.o = Outcome{Kind: Unavailable, Cause: DeadlinePassed, Err: fmt.Errorf("sluice: nothing sent: %w", r.Err)}
	case r.Local:
		// The store's admitted status for the block, which a spend of
		// fixed_window, token_bucket or gcra fills with these numbers alone.
		b := r.Base
		d.o = Outcome{Kind: Allowed, Status: Status{Policy: p.ID, Allowed: true, Limit: b.Limit, Remaining: b.Remaining + r.Left,
			ResetAfter: max(b.ResetAfter-r.Since, 0), RetryAfter: b.RetryAfter}, Local: true}
	default:
		d.o.Remaining += r.Extra
	}
}
