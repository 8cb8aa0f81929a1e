package sluice

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Local quota (Policy.LocalQuota): a Limiter takes a block of units for a
// subject it sees often, in one store decision, and admits from it itself.
//
// Why no block admits more than the algorithm allows. A block of k units
// is asked at sent (read before the store is asked, so never after the
// store's own time t0) and used only before sent + BlockTime, so every
// unit of it is admitted at a real time in [t0, t0 + BlockTime].
//
//   - fixed_window: the store counts all k in the window holding t0, and
//     the block ends no later than sent + ResetAfter, the end of that
//     window: every unit is admitted inside the window that counted it,
//     so each window still holds at most Limit.
//   - token_bucket and gcra: the store spends k as if at t0 + BlockTime
//     (Evaluation.Hold). In GCRA's terms the bucket's content c(t) is the
//     sup over s ≤ t of (units arrived in [s, t]) − (t − s)/T; the store
//     drains nothing of the block before t0 + Hold, so for every interval
//     it counts at least the units really admitted in it, the store's
//     content is at least the real one at every instant, and a store that
//     keeps its own content within Burst keeps the real one within it.
//
// Unspent units are not given back: a refund after a bucket's held spend
// cannot tell the block's units from the ones spent after it (the TAT's
// max() forgets which), and a fixed window's refund cannot know it lands
// in the window that counted them. They are the under-admission local
// quota costs, at most a block per subject and instance, counted in
// LocalStats.Unused.

// localShards is how many locks the blocks are spread over.
const localShards = 64

// maxLocal bounds the subjects a Limiter tracks for local quota; past it,
// a new subject is decided by the store until room is made.
const maxLocal = 100_000

// localShare is the share of what the store last said remains that one
// block may take (1/localShare), so several instances can hold blocks and
// a subject near its limit is decided one request at a time.
const localShare = 4

// localQuota holds a Limiter's blocks. Safe for concurrent use.
type localQuota struct {
	clock  Clock
	seed   maphash.Seed
	shards [localShards]localShard
	stats  map[string]*localCounters // per policy ID, fixed at New
}

type localShard struct {
	mu    sync.Mutex
	m     map[nearKey]*quotaEntry
	swept time.Time // when sweep last ran: it runs at most every sweepEvery
}

// sweepEvery is how often a full shard is swept at most, so a flood of
// new subjects does not scan it on every request.
const sweepEvery = 100 * time.Millisecond

// localCounters are one policy's LocalStats.
type localCounters struct{ local, blocks, units, unused atomic.Int64 }

// LocalStats counts what a Limiter's local quota did for one policy
// (Policy.LocalQuota), since New.
type LocalStats struct {
	// Local is the requests admitted from blocks, without a store call.
	Local int64
	// Blocks is the blocks taken, one store call each.
	Blocks int64
	// Units is the units the blocks took from the store.
	Units int64
	// Unused is the units of blocks whose time ran out before they were
	// admitted (or that were dropped): spent in the store, admitted to
	// nobody. Counted when the Limiter next sees the subject, or forgets it.
	Unused int64
}

// quotaEntry is one subject's local quota for one policy: its block, and
// what it asked lately. Guarded by its shard's lock.
type quotaEntry struct {
	policy  *Policy        // the numbers the block was taken under (an override's own)
	stats   *localCounters // the policy's counters
	left    int64          // units of the block not yet admitted
	until   time.Time      // when the block's time is up
	base    Status         // the store's status when the block was taken
	baseAt  time.Time      // when it was asked
	pending chan struct{}  // non-nil while a block is being asked; closed when the answer is in
	resets  int64          // Resets seen: a block asked before one is not kept

	remaining int64 // what the store last said remains; valid when known
	known     bool
	cur       int64     // units asked in the current period of BlockTime
	past      [3]int64  // units asked in each of the three periods before it, newest first
	period    time.Time // when the current period began
}

func newLocalQuota(c Clock, policies []*Policy) *localQuota {
	q := &localQuota{clock: c, seed: maphash.MakeSeed(), stats: make(map[string]*localCounters)}
	for i := range q.shards {
		q.shards[i].m = make(map[nearKey]*quotaEntry)
	}
	for _, p := range policies {
		if p.LocalQuota.Enabled {
			q.stats[p.ID] = new(localCounters)
		}
	}
	return q
}

// shard returns the shard of subject.
func (q *localQuota) shard(subject string) *localShard {
	return &q.shards[maphash.String(q.seed, subject)%localShards]
}

// entry returns the entry of subject under p, created if there is room
// (nil if not), with sh locked: the caller unlocks it.
func (q *localQuota) entry(sh *localShard, subject string, p *Policy, now time.Time) *quotaEntry {
	k := nearKey{Subject: subject, Policy: p.ID}
	e := sh.m[k]
	if e == nil {
		if len(sh.m) >= maxLocal/localShards && !sh.sweep(now) {
			return nil
		}
		e = &quotaEntry{stats: q.stats[p.ID], period: now}
		sh.m[k] = e
	}
	if !samePolicy(e.policy, p) { // new, or the subject's numbers changed: what was kept is of others
		e.drop()
		e.known, e.cur, e.past, e.period = false, 0, [3]int64{}, now
	}
	e.policy = p
	return e
}

// samePolicy reports whether a and b hold the same numbers: an override
// snapshot read again gives a subject a new *Policy with the numbers it
// had, which must not cost it its block and what it asked lately.
func samePolicy(a, b *Policy) bool { return a == b || a != nil && *a == *b }

// sweep forgets the subjects of sh with no block being asked, none in
// hand, and nothing asked in about the last three periods, and reports
// whether that made room.
func (sh *localShard) sweep(now time.Time) bool {
	if now.Sub(sh.swept) < sweepEvery {
		return false
	}
	sh.swept = now
	for k, e := range sh.m {
		if e.pending == nil && now.Sub(e.period) >= 4*e.policy.LocalQuota.BlockTime && !now.Before(e.until) {
			e.drop()
			delete(sh.m, k)
		}
	}
	return len(sh.m) < maxLocal/localShards
}

// drop gives up e's block, counting its units as unused.
func (e *quotaEntry) drop() {
	if e.left > 0 {
		e.stats.unused.Add(e.left)
		e.left = 0
	}
}

// arrive counts cost asked at now in e's periods of BlockTime.
func (e *quotaEntry) arrive(now time.Time, cost int64) {
	if bt := e.policy.LocalQuota.BlockTime; now.Sub(e.period) >= bt {
		gone := min(int64(now.Sub(e.period)/bt), int64(len(e.past))+1) // periods ended: the last with cur, the others empty
		for range gone {
			e.past[2], e.past[1], e.past[0] = e.past[1], e.past[0], e.cur
			e.cur = 0
		}
		e.period = now
	}
	e.cur += cost
}

// take admits cost from e's block at now, if the block holds it and its
// time is not up: the status then is the one the store gave when the
// block was taken, with the units still in hand added to Remaining and
// the waits shortened by the time since.
func (e *quotaEntry) take(now time.Time, cost int64) (Status, bool) {
	if e.left == 0 {
		return Status{}, false
	}
	if !now.Before(e.until) {
		e.drop()
		return Status{}, false
	}
	if e.left < cost {
		return Status{}, false
	}
	e.left -= cost
	st := e.base
	st.Remaining += e.left
	st.ResetAfter = max(st.ResetAfter-now.Sub(e.baseAt), 0)
	return st, true
}

// size returns the units of a block to ask for a request of cost, or 0
// for none: the least the subject asked in each of the last three
// periods of BlockTime (so a subject seen a few times a second, whose
// arrivals bunch up now and then, takes none), at most MaxBlock and a
// localShare of what the store last said remains, and at least minBlock
// and twice cost. For the bucket
// algorithms the block and what its hold drains of the bucket must fit in
// that remainder too, or the store would deny it.
func (e *quotaEntry) size(cost int64) int64 {
	p := e.policy
	if !e.known {
		return 0
	}
	k := min(e.past[0], e.past[1], e.past[2], p.LocalQuota.MaxBlock, e.remaining/localShare, e.remaining-p.drained())
	if k < minBlock || k < 2*cost {
		return 0
	}
	return k
}

// drained returns the units a block's hold takes from a token_bucket or
// gcra bucket beside the block (what the bucket refills over BlockTime,
// rounded up); 0 for fixed_window.
func (p *Policy) drained() int64 {
	if p.Algorithm != TokenBucket && p.Algorithm != GCRA {
		return 0
	}
	return ceilDiv(p.LocalQuota.BlockTime.Microseconds()*p.Limit, p.Window.Microseconds())
}

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// do is local quota's stage. A Spend of one LocalQuota policy (the
// subject's own numbers: an override too small for blocks has none),
// named by Request.Policy, with no evaluation id or older subject, of a cost within MaxCost, is
// admitted from the subject's block when it holds the cost; else a block
// is asked for when the subject is asked often enough (takeBlock); else
// the spend goes on as it came, and what the store says remains is
// learnt. A Reset drops the subject's blocks under its policies.
func (q *localQuota) do(ctx context.Context, d *decision, next step) {
	ev := &d.ev
	if ev.Op == Reset {
		for _, p := range ev.Policies {
			q.forget(ev.Subject, p)
		}
	}
	if ev.Op != Spend || d.many || len(ev.Policies) != 1 || !ev.Policies[0].LocalQuota.Enabled || ev.EvaluationID != "" || len(ev.Previous) > 0 || ev.Cost < 1 || ev.Cost > ev.Policies[0].MaxCost {
		next(ctx, d)
		return
	}
	p, cost := ev.Policies[0], ev.Cost
	sh := q.shard(ev.Subject)
	for waited := false; ; waited = true {
		sh.mu.Lock()
		now := q.clock.Now() // under the lock: no unit is taken later than the time its block is judged at
		e := q.entry(sh, ev.Subject, p, now)
		if e == nil {
			sh.mu.Unlock()
			next(ctx, d)
			return
		}
		if !waited {
			e.arrive(now, cost)
		}
		if st, ok := e.take(now, cost); ok {
			sh.mu.Unlock()
			e.stats.local.Add(1)
			d.o = Outcome{Kind: Allowed, Status: st, Local: true}
			return
		}
		if ch := e.pending; ch != nil && !waited {
			sh.mu.Unlock() // another request is asking for a block: it may hold this one too
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				d.o = Outcome{Kind: Unavailable, Cause: DeadlinePassed, Err: fmt.Errorf("sluice: nothing sent: %w", ctx.Err())}
				return
			}
		}
		k := e.size(cost)
		if k == 0 || e.pending != nil {
			sh.mu.Unlock()
			next(ctx, d)
			q.learn(sh, e, p, &d.o)
			return
		}
		e.pending = make(chan struct{})
		resets := e.resets
		sh.mu.Unlock()
		q.takeBlock(ctx, d, next, sh, e, k, resets)
		return
	}
}

// learn records what the store's answer o says remains of e's subject.
func (q *localQuota) learn(sh *localShard, e *quotaEntry, p *Policy, o *Outcome) {
	if o.Kind != Allowed && o.Kind != Denied {
		return
	}
	sh.mu.Lock()
	if samePolicy(e.policy, p) {
		e.remaining, e.known = o.Remaining, true
	}
	sh.mu.Unlock()
}

// takeBlock asks the store, through next, for a block of k units of d's
// policy for e, of which d's own spend takes its cost, and answers d: from
// the block when it is admitted, else by a decision of its own.
func (q *localQuota) takeBlock(ctx context.Context, d *decision, next step, sh *localShard, e *quotaEntry, k, resets int64) {
	ev := &d.ev
	p, cost := ev.Policies[0], ev.Cost
	sent := q.clock.Now()
	ev.Cost, ev.Hold = k, p.LocalQuota.BlockTime
	next(ctx, d)
	ev.Cost, ev.Hold = cost, 0
	o := &d.o
	sh.mu.Lock()
	close(e.pending)
	e.pending = nil
	if o.Kind != Allowed {
		sh.mu.Unlock()
		if o.Kind != Denied {
			return // the store could not decide: neither could a second call
		}
		q.learn(sh, e, p, o)
		next(ctx, d)
		q.learn(sh, e, p, o)
		return
	}
	e.stats.blocks.Add(1)
	e.stats.units.Add(k)
	if !samePolicy(e.policy, p) || e.resets != resets {
		// The subject's numbers changed meanwhile (the block is of
		// others), or it was reset (the block was spent before).
		sh.mu.Unlock()
		e.stats.unused.Add(k - cost)
		return
	}
	life := p.LocalQuota.BlockTime
	if p.Algorithm == FixedWindow {
		life = min(life, o.ResetAfter) // the window that counted the block ends then
	}
	e.drop() // what is left of the block before, too small for a request
	e.left, e.until, e.base, e.baseAt = k-cost, sent.Add(life), o.Status, sent
	// What remains, as size reckons it: a bucket's answer has the hold's
	// drain taken out already, which size takes out again.
	e.remaining, e.known = o.Remaining+p.drained(), true
	o.Remaining += e.left
	sh.mu.Unlock()
}

// forget drops this Limiter's block of subject under p (a Reset).
func (q *localQuota) forget(subject string, p *Policy) {
	sh := q.shard(subject)
	sh.mu.Lock()
	if e := sh.m[nearKey{Subject: subject, Policy: p.ID}]; e != nil {
		e.drop()
		e.known = false
		e.resets++ // a block being asked now was spent before the reset
	}
	sh.mu.Unlock()
}

// LocalStats returns what local quota did for the policy with the given
// ID (Policy.LocalQuota): all zero for a policy without it.
func (l *Limiter) LocalStats(policy string) LocalStats {
	if l.local == nil || l.local.stats[policy] == nil {
		return LocalStats{}
	}
	c := l.local.stats[policy]
	return LocalStats{Local: c.local.Load(), Blocks: c.blocks.Load(), Units: c.units.Load(), Unused: c.unused.Load()}
}
