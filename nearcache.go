package sluice

import (
	"context"

	"github.com/sluicehq/sluice/internal/nearcache"
)

// nearCache is the near cache's stage over internal/nearcache's
// bookkeeping: per subject and NearCache policy, a denial the store gave
// and until when it holds, so the Limiter can deny again without asking.
type nearCache struct {
	clock Clock // the Limiter's
	c     *nearcache.Cache[*Policy, Status]
}

// nearKey is a subject and a policy ID (local quota keys its subjects the
// same way).
type nearKey = nearcache.Key

func newNearCache(c Clock) *nearCache {
	return &nearCache{clock: c, c: nearcache.New[*Policy, Status]()}
}

// do is the near cache's stage. A Spend of one NearCache policy with no
// evaluation id is denied from a remembered denial that covers its cost,
// without the store (Outcome.FromCache), its waits measured from now; a
// denial the store gives it is remembered, until the retry time it names
// counted from before the store was asked. A Reset forgets the subject's
// denials under its policies.
func (c *nearCache) do(ctx context.Context, d *decision, next step) {
	ev := &d.ev
	if ev.Op == Reset {
		for _, p := range ev.Policies {
			c.c.Forget(nearKey{Subject: ev.Subject, Policy: p.ID})
		}
	}
	if ev.Op != Spend || len(ev.Policies) != 1 || !ev.Policies[0].NearCache || ev.EvaluationID != "" || ev.Cost > ev.Policies[0].MaxCost || ev.Policies[0].reserves(ev.Priority) {
		next(ctx, d)
		return
	}
	p, cost, sent := ev.Policies[0], ev.Cost, c.clock.Now()
	k := nearKey{Subject: ev.Subject, Policy: p.ID}
	if st, until, resetAt, ok := c.c.Lookup(k, p, cost, sent); ok {
		st.RetryAfter = until.Sub(sent)
		st.ResetAfter = max(resetAt.Sub(sent), st.RetryAfter)
		d.o = Outcome{Kind: Denied, Status: st, FromCache: true}
		if d.many {
			d.o.Statuses = []Status{st}
		}
		return
	}
	next(ctx, d)
	if st := d.o.Status; d.o.Kind == Denied && !d.o.FromCache {
		c.c.Remember(k, p, cost, sent, sent.Add(st.RetryAfter), sent.Add(st.ResetAfter), st)
	}
}
