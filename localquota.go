package sluice

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/localquota"
)

// localQuota is local quota's stage (Policy.LocalQuota) over
// internal/localquota's blocks, whose package doc proves the bound.
type localQuota struct {
	q *localquota.Quota[*Policy, Status]
}

func newLocalQuota(c Clock, hook localquota.Hook) *localQuota {
	return &localQuota{q: localquota.New[*Policy, Status](c, hook)}
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
	n := localquota.Numbers{ID: p.ID, BlockTime: p.LocalQuota.BlockTime, MaxBlock: p.LocalQuota.MaxBlock, Drained: p.drained(), Windowed: p.Algorithm == FixedWindow}
	r := lq.q.Spend(ctx, ev.Subject, p, &n, cost, func(k int64, hold time.Duration) localquota.Answer[Status] {
		ev.Cost, ev.Hold = k, hold
		next(ctx, d)
		ev.Cost, ev.Hold = cost, 0
		a := localquota.Answer[Status]{Status: d.o.Status, Remaining: d.o.Remaining, ResetAfter: d.o.ResetAfter}
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
		st := r.Base
		st.Remaining += r.Left
		st.ResetAfter = max(st.ResetAfter-r.Since, 0)
		d.o = Outcome{Kind: Allowed, Status: st, Local: true}
	default:
		d.o.Remaining += r.Extra
	}
}

// drained returns the units a block's hold takes from a token_bucket or
// gcra bucket beside the block (what the bucket refills over BlockTime,
// rounded up); 0 for fixed_window.
func (p *Policy) drained() int64 {
	if p.Algorithm != TokenBucket && p.Algorithm != GCRA {
		return 0
	}
	w := p.Window.Microseconds()
	return (p.LocalQuota.BlockTime.Microseconds()*p.Limit + w - 1) / w
}
