package sluice

import (
	"context"
	"sync"
	"time"
)

// maxNearCache bounds the denials a Limiter remembers.
const maxNearCache = 100_000

// nearCache remembers, per subject and NearCache policy, a denial the
// store gave and until when it holds, so the Limiter can deny again
// without asking. Safe for concurrent use.
type nearCache struct {
	clock Clock // the Limiter's
	mu    sync.Mutex
	m     map[nearKey]nearEntry
}

// nearKey is a subject and a policy ID: one entry whatever numbers the
// policy had (an override gives one subject others), so a Reset forgets it
// under any of them.
type nearKey struct {
	subject string
	policy  string
}

// nearEntry is a remembered denial: a cost of at least cost is denied
// until until, when the store said it would wait RetryAfter, measured from
// before the store was asked (so never later than the store's own time).
type nearEntry struct {
	policy  *Policy // the numbers it was denied under: none other use it
	cost    int64
	until   time.Time // monotonic
	resetAt time.Time
	status  Status
}

func newNearCache(c Clock) *nearCache { return &nearCache{clock: c, m: make(map[nearKey]nearEntry)} }

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
	c.mu.Lock()
	k := nearKey{subject, p.ID}
	e, ok := c.m[k]
	if ok && (!now.Before(e.until) || e.policy != p) {
		delete(c.m, k)
		ok = false
	}
	c.mu.Unlock()
	if !ok || cost < e.cost {
		return Status{}, false
	}
	st := e.status
	st.RetryAfter = e.until.Sub(now)
	st.ResetAfter = max(e.resetAt.Sub(now), st.RetryAfter)
	return st, true
}

// remember records the store's denial st of cost, asked at sent.
func (c *nearCache) remember(subject string, p *Policy, cost int64, sent time.Time, st Status) {
	k := nearKey{subject, p.ID}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= maxNearCache {
		for k, e := range c.m { // make room: what has expired goes
			if !sent.Before(e.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxNearCache {
			return // full of live denials: this one is simply asked again
		}
	}
	c.m[k] = nearEntry{policy: p, cost: cost, until: sent.Add(st.RetryAfter), resetAt: sent.Add(st.ResetAfter), status: st}
}

// forget drops what is remembered of subject under p.
func (c *nearCache) forget(subject string, p *Policy) {
	c.mu.Lock()
	delete(c.m, nearKey{subject, p.ID})
	c.mu.Unlock()
}
