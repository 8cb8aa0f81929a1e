package sluice

import (
	"context"
	"time"

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
// without the store (Outcome.FromCache); a denial the store gives it is
// remembered. A Reset forgets the subject's denials under its policies.
func (c *nearCache) do(ctx context.Context, d *decision, next step) {
	ev := &d.ev
	if ev.Op == Reset {
		for _, p := range ev.Policies {
			c.forget(ev.Subject, p)
		}
	}
	if ev.Op != Spend || len(ev.Policies) != 1 || !ev.Policies[0].NearCache || ev.EvaluationID != "" || ev.Cost > ev.Policies[0].MaxCost {
		next(ctx, d)
		return
	}
	p, cost, sent := ev.Policies[0], ev.Cost, c.clock.Now()
	if st, ok := c.lookup(ev.Subject, p, cost, sent); ok {
		d.o = Outcome{Kind: Denied, Status: st, FromCache: true}
		if d.many {
			d.o.Statuses = []Status{st}
		}
		return
	}
	next(ctx, d)
	if d.o.Kind == Denied && !d.o.FromCache {
		c.remember(ev.Subject, p, cost, sent, d.o.Status)
	}
}

// lookup returns the status of a remembered denial that covers cost at
// now, its waits measured from now.
func (c *nearCache) lookup(subject string, p *Policy, cost int64, now time.Time) (Status, bool) {
	st, until, resetAt, ok := c.c.Lookup(nearKey{Subject: subject, Policy: p.ID}, p, cost, now)
	if !ok {
		return Status{}, false
	}
	st.RetryAfter = until.Sub(now)
	st.ResetAfter = max(resetAt.Sub(now), st.RetryAfter)
	return st, true
}

// remember records the store's denial st of cost, asked at sent.
func (c *nearCache) remember(subject string, p *Policy, cost int64, sent time.Time, st Status) {
	c.c.Remember(nearKey{Subject: subject, Policy: p.ID}, p, cost, sent, sent.Add(st.RetryAfter), sent.Add(st.ResetAfter), st)
}

// forget drops what is remembered of subject under p.
func (c *nearCache) forget(subject string, p *Policy) {
	c.c.Forget(nearKey{Subject: subject, Policy: p.ID})
}
