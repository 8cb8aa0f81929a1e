package sluice

import (
	"context"
	"sync"
	"time"
)

// nearCacheMax bounds the denials a near cache remembers.
const nearCacheMax = 100_000

// nearCache is the near cache's stage: per subject and NearCache policy,
// a denial the store gave and until when it holds, so the Limiter can
// deny again without asking, bounded in number (nearCacheMax). Safe for
// concurrent use.
type nearCache struct {
	clock Clock // the Limiter's
	mu    sync.Mutex
	m     map[nearKey]nearEntry
}

// nearKey is a subject and a policy ID: one entry whatever numbers the
// policy had (an override gives one subject others), so a Reset forgets
// it under any of them.
type nearKey struct {
	Subject string
	Policy  string
}

// nearEntry is a remembered denial: a cost of at least cost is denied
// until until, measured from before the store was asked.
type nearEntry struct {
	policy  *Policy // the numbers it was denied under: none other use it
	cost    int64
	until   time.Time // monotonic
	resetAt time.Time
	status  Status
}

func newNearCache(c Clock) *nearCache {
	return &nearCache{clock: c, m: make(map[nearKey]nearEntry)}
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
			c.forget(nearKey{Subject: ev.Subject, Policy: p.ID})
		}
	}
	if ev.Op != Spend || len(ev.Policies) != 1 || !ev.Policies[0].NearCache || ev.EvaluationID != "" || ev.Cost > ev.Policies[0].MaxCost || ev.Policies[0].reserves(ev.Priority) {
		next(ctx, d)
		return
	}
	p, cost, sent := ev.Policies[0], ev.Cost, c.clock.Now()
	k := nearKey{Subject: ev.Subject, Policy: p.ID}
	if st, until, resetAt, ok := c.lookup(k, p, cost, sent); ok {
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
		c.remember(k, p, cost, sent, sent.Add(st.RetryAfter), sent.Add(st.ResetAfter), st)
	}
}

// lookup returns the status of a denial remembered for k under p that
// covers cost at now, with until and resetAt, the instants its waits end.
// An entry expired at now, or kept under other numbers than p, is
// dropped.
func (c *nearCache) lookup(k nearKey, p *Policy, cost int64, now time.Time) (st Status, until, resetAt time.Time, ok bool) {
	c.mu.Lock()
	e, ok := c.m[k]
	if ok && (!now.Before(e.until) || e.policy != p) {
		delete(c.m, k)
		ok = false
	}
	c.mu.Unlock()
	if !ok || cost < e.cost {
		return st, until, resetAt, false
	}
	return e.status, e.until, e.resetAt, true
}

// remember records a denial of cost for k under p, holding until until
// (its reset at resetAt), asked at sent. When the cache is full, what
// has expired at sent goes; full of live denials, this one is not kept
// (it is simply asked again).
func (c *nearCache) remember(k nearKey, p *Policy, cost int64, sent, until, resetAt time.Time, st Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= nearCacheMax {
		for k, e := range c.m {
			if !sent.Before(e.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= nearCacheMax {
			return
		}
	}
	c.m[k] = nearEntry{policy: p, cost: cost, until: until, resetAt: resetAt, status: st}
}

// forget drops what is remembered for k.
func (c *nearCache) forget(k nearKey) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}
