// Package nearcache holds the near cache's bookkeeping for the root's
// stage (sluice's nearcache.go): denials remembered by subject and policy
// ID, each until when it holds, bounded in number. It knows nothing of
// policies or statuses but what the stage hands it: P names the numbers a
// denial was given under (compared for identity), S is the status kept.
package nearcache

import (
	"sync"
	"time"
)

// Max bounds the denials a Cache remembers.
const Max = 100_000

// Key is a subject and a policy ID: one entry whatever numbers the policy
// had (an override gives one subject others), so a Reset forgets it under
// any of them.
type Key struct {
	Subject string
	Policy  string
}

// entry is a remembered denial: a cost of at least cost is denied until
// until, measured from before the store was asked.
type entry[P comparable, S any] struct {
	policy  P // the numbers it was denied under: none other use it
	cost    int64
	until   time.Time // monotonic
	resetAt time.Time
	status  S
}

// Cache remembers denials. Safe for concurrent use; the zero value is not
// ready: use New.
type Cache[P comparable, S any] struct {
	mu sync.Mutex
	m  map[Key]entry[P, S]
}

// New returns an empty Cache.
func New[P comparable, S any]() *Cache[P, S] {
	return &Cache[P, S]{m: make(map[Key]entry[P, S])}
}

// Lookup returns the status of a denial remembered for k under p that
// covers cost at now, with until and resetAt, the instants its waits end.
// An entry expired at now, or kept under other numbers than p, is
// dropped.
func (c *Cache[P, S]) Lookup(k Key, p P, cost int64, now time.Time) (st S, until, resetAt time.Time, ok bool) {
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

// Remember records a denial of cost for k under p, holding until until
// (its reset at resetAt), asked at sent. When the Cache is full, what
// has expired at sent goes; full of live denials, this one is not kept
// (it is simply asked again).
func (c *Cache[P, S]) Remember(k Key, p P, cost int64, sent, until, resetAt time.Time, st S) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= Max {
		for k, e := range c.m {
			if !sent.Before(e.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= Max {
			return
		}
	}
	c.m[k] = entry[P, S]{policy: p, cost: cost, until: until, resetAt: resetAt, status: st}
}

// Forget drops what is remembered for k.
func (c *Cache[P, S]) Forget(k Key) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// Len is how many denials are remembered.
func (c *Cache[P, S]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
