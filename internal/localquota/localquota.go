// Package localquota is local quota's bookkeeping and arithmetic for the
// root's stage (sluice's localquota.go, Policy.LocalQuota): a Limiter
// takes a block of units for a subject it sees often, in one store
// decision, and admits from it itself. It knows policies and statuses in
// the engine's terms only: a policy's Numbers (compared by ==: a block is
// kept only under the numbers it was taken under), and the numbers of the
// store's Answer, kept to answer from the block.
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
// quota costs, at most a block per subject and instance, reported to the
// Hook as unused.
package localquota

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policydefaults"
)

// shards is how many locks the blocks are spread over.
const shards = 64

// maxSubjects bounds the subjects a Quota tracks; past it, a new subject
// is decided by the store until room is made.
const maxSubjects = 100_000

// share is the share of what the store last said remains that one block
// may take (1/share), so several instances can hold blocks and a subject
// near its limit is decided one request at a time.
const share = 4

// sweepEvery is how often a full shard is swept at most, so a flood of
// new subjects does not scan it on every request.
const sweepEvery = 100 * time.Millisecond

// Clock tells the time: the Limiter's.
type Clock interface{ Now() time.Time }

// Hook, when set, is told what local quota did for a policy, as deltas:
// requests admitted from blocks without a store call (local), blocks
// taken (one store call each) and the units they took, and units of
// blocks whose time ran out before they were admitted (or that were
// dropped): spent in the store, admitted to nobody, counted when the
// Quota next sees the subject or forgets it.
type Hook func(policy string, local, blocks, units, unused int64)

// Numbers are a policy's numbers as local quota reads them, defaults
// applied. They are a subject's identity under the policy: compared by
// ==, a block is kept only under the numbers it was taken under, so an
// override that gives the subject other numbers drops what was kept
// (the rest of a policy is fixed by its ID in a Limiter, and an
// override's MaxCost follows from these).
type Numbers struct {
	ID string
	// The store's numbers: the algorithm (fixed_window, token_bucket or
	// gcra), Limit, Window and Burst.
	Kind   algorithm.Kind
	Limit  int64
	Window time.Duration
	Burst  int64
	// Local quota's own (Policy.LocalQuota).
	BlockTime time.Duration
	MaxBlock  int64
}

// windowed reports whether n is fixed_window's, whose block ends with
// the window that counted it (the admitted answer's ResetAfter).
func (n *Numbers) windowed() bool { return n.Kind == algorithm.KindFixedWindow }

// drained returns the units a block's hold takes from a token_bucket or
// gcra bucket beside the block (what the bucket refills over BlockTime,
// rounded up); 0 for fixed_window.
func (n *Numbers) drained() int64 {
	if n.Kind != algorithm.KindTokenBucket && n.Kind != algorithm.KindGCRA {
		return 0
	}
	w := n.Window.Microseconds()
	return (n.BlockTime.Microseconds()*n.Limit + w - 1) / w
}

// The kinds of store answer an Answer carries.
const (
	Failed  = iota // no decision: neither could a second call take one
	Allowed        // admitted
	Denied         // denied: what remains is learnt
)

// Answer is what the store said to a spend sent through a Send: its
// kind, and its status's numbers (of an admitted block, the ones to
// answer from the block).
type Answer struct {
	Kind       int
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
}

// Send sends the spend under way to the store with cost units and hold
// (Evaluation.Hold; 0 for a plain spend), and returns its answer.
type Send func(cost int64, hold time.Duration) Answer

// Result is how a Spend was answered.
type Result struct {
	// Local: admitted from a block; Base is the store's answer when the
	// block was taken, Left the units still in hand (to add to its
	// Remaining), Since how long ago it was asked (to take off its waits).
	Local bool
	Base  Answer
	Left  int64
	Since time.Duration
	// Extra is the units still in hand of a block just taken with the
	// spend's own answer, to add to that answer's Remaining.
	Extra int64
	// Err is the context's error when it ended while another request's
	// block was being asked: nothing was sent.
	Err error
}

// Quota holds a Limiter's blocks. Safe for concurrent use.
type Quota struct {
	clock  Clock
	hook   Hook
	seed   maphash.Seed
	shards [shards]shard
}

// key is a subject and a policy ID: one block whatever numbers the policy
// has (an override gives one subject others).
type key struct {
	Subject string
	Policy  string
}

type shard struct {
	mu    sync.Mutex
	m     map[key]*entry
	swept time.Time // when sweep last ran: it runs at most every sweepEvery
}

// entry is one subject's local quota for one policy: its block, and
// what it asked lately. Guarded by its shard's lock.
type entry struct {
	n       Numbers // the numbers the block was taken under (an override's own)
	set     bool    // n is set
	left    int64   // units of the block not yet admitted
	until   time.Time
	base    Answer    // the store's answer when the block was taken
	baseAt  time.Time // when it was asked
	pending chan struct{}
	resets  int64 // Resets seen: a block asked before one is not kept

	remaining int64 // what the store last said remains; valid when known
	known     bool
	cur       int64     // units asked in the current period of BlockTime
	past      [3]int64  // units asked in each of the three periods before it, newest first
	period    time.Time // when the current period began
}

// New returns an empty Quota over clock c, reporting to hook (nil: none).
func New(c Clock, hook Hook) *Quota {
	q := &Quota{clock: c, hook: hook, seed: maphash.MakeSeed()}
	for i := range q.shards {
		q.shards[i].m = make(map[key]*entry)
	}
	return q
}

// report tells q's hook of one policy's deltas.
func (q *Quota) report(policy string, local, blocks, units, unused int64) {
	if q.hook != nil {
		q.hook(policy, local, blocks, units, unused)
	}
}

// shard returns the shard of subject.
func (q *Quota) shard(subject string) *shard {
	return &q.shards[maphash.String(q.seed, subject)%shards]
}

// entry returns the entry of subject under n, created if there is room
// (nil if not), with sh locked: the caller unlocks it.
func (q *Quota) entry(sh *shard, subject string, n *Numbers, now time.Time) *entry {
	k := key{Subject: subject, Policy: n.ID}
	e := sh.m[k]
	if e == nil {
		if len(sh.m) >= maxSubjects/shards && !q.sweep(sh, now) {
			return nil
		}
		e = &entry{period: now}
		sh.m[k] = e
	}
	if !e.set || e.n != *n { // new, or the subject's numbers changed: what was kept is of others
		q.drop(e)
		e.known, e.cur, e.past, e.period = false, 0, [3]int64{}, now
		e.n, e.set = *n, true
	}
	return e
}

// sweep forgets the subjects of sh with no block being asked, none in
// hand, and nothing asked in about the last three periods, and reports
// whether that made room.
func (q *Quota) sweep(sh *shard, now time.Time) bool {
	if now.Sub(sh.swept) < sweepEvery {
		return false
	}
	sh.swept = now
	for k, e := range sh.m {
		if e.pending == nil && now.Sub(e.period) >= 4*e.n.BlockTime && !now.Before(e.until) {
			q.drop(e)
			delete(sh.m, k)
		}
	}
	return len(sh.m) < maxSubjects/shards
}

// drop gives up e's block, counting its units as unused.
func (q *Quota) drop(e *entry) {
	if e.left > 0 {
		q.report(e.n.ID, 0, 0, 0, e.left)
		e.left = 0
	}
}

// arrive counts cost asked at now in e's periods of BlockTime.
func (e *entry) arrive(now time.Time, cost int64) {
	if bt := e.n.BlockTime; now.Sub(e.period) >= bt {
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
// time is not up.
func (q *Quota) take(e *entry, now time.Time, cost int64) (Result, bool) {
	if e.left == 0 {
		return Result{}, false
	}
	if !now.Before(e.until) {
		q.drop(e)
		return Result{}, false
	}
	if e.left < cost {
		return Result{}, false
	}
	e.left -= cost
	return Result{Local: true, Base: e.base, Left: e.left, Since: now.Sub(e.baseAt)}, true
}

// size returns the units of a block to ask for a request of cost, or 0
// for none: the least the subject asked in each of the last three
// periods of BlockTime (so a subject seen a few times a second, whose
// arrivals bunch up now and then, takes none), at most MaxBlock and a
// share of what the store last said remains, and at least MinBlock and
// twice cost. For the bucket algorithms the block and what its hold
// drains of the bucket must fit in that remainder too, or the store
// would deny it.
func (e *entry) size(cost int64) int64 {
	if !e.known {
		return 0
	}
	k := min(e.past[0], e.past[1], e.past[2], e.n.MaxBlock, e.remaining/share, e.remaining-e.n.drained())
	if k < policydefaults.MinBlock || k < 2*cost {
		return 0
	}
	return k
}

// Spend answers a spend of cost by subject under the policy's numbers
// n: from the subject's block when it holds the cost; else by asking,
// through send, for a block when the subject is asked often enough; else
// by sending the spend as it came, learning what the store says remains.
// ctx bounds the wait for another request's block.
func (q *Quota) Spend(ctx context.Context, subject string, n *Numbers, cost int64, send Send) Result {
	sh := q.shard(subject)
	for waited := false; ; waited = true {
		sh.mu.Lock()
		now := q.clock.Now() // under the lock: no unit is taken later than the time its block is judged at
		e := q.entry(sh, subject, n, now)
		if e == nil {
			sh.mu.Unlock()
			send(cost, 0)
			return Result{}
		}
		if !waited {
			e.arrive(now, cost)
		}
		if r, ok := q.take(e, now, cost); ok {
			sh.mu.Unlock()
			q.report(n.ID, 1, 0, 0, 0)
			return r
		}
		if ch := e.pending; ch != nil && !waited {
			sh.mu.Unlock() // another request is asking for a block: it may hold this one too
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return Result{Err: ctx.Err()}
			}
		}
		k := e.size(cost)
		if k == 0 || e.pending != nil {
			sh.mu.Unlock()
			q.learn(sh, e, n, send(cost, 0))
			return Result{}
		}
		e.pending = make(chan struct{})
		resets := e.resets
		sh.mu.Unlock()
		return q.takeBlock(sh, e, n, cost, k, resets, send)
	}
}

// learn records what the store's answer a says remains of e's subject.
func (q *Quota) learn(sh *shard, e *entry, n *Numbers, a Answer) {
	if a.Kind == Failed {
		return
	}
	sh.mu.Lock()
	if e.n == *n {
		e.remaining, e.known = a.Remaining, true
	}
	sh.mu.Unlock()
}

// takeBlock asks the store, through send, for a block of k units under
// n for e, held n's BlockTime, of which the spend under way takes its
// cost, and answers it: from the block when it is admitted, else by a
// decision of its own.
func (q *Quota) takeBlock(sh *shard, e *entry, n *Numbers, cost, k, resets int64, send Send) Result {
	sent := q.clock.Now()
	a := send(k, n.BlockTime)
	sh.mu.Lock()
	close(e.pending)
	e.pending = nil
	if a.Kind != Allowed {
		sh.mu.Unlock()
		if a.Kind == Denied {
			q.learn(sh, e, n, a)
			q.learn(sh, e, n, send(cost, 0))
		}
		return Result{} // else the store could not decide: neither could a second call
	}
	q.report(n.ID, 0, 1, k, 0)
	if e.n != *n || e.resets != resets {
		// The subject's numbers changed meanwhile (the block is of
		// others), or it was reset (the block was spent before).
		sh.mu.Unlock()
		q.report(n.ID, 0, 0, 0, k-cost)
		return Result{}
	}
	life := n.BlockTime
	if n.windowed() {
		life = min(life, a.ResetAfter) // the window that counted the block ends then
	}
	q.drop(e) // what is left of the block before, too small for a request
	e.left, e.until, e.base, e.baseAt = k-cost, sent.Add(life), a, sent
	// What remains, as size reckons it: a bucket's answer has the hold's
	// drain taken out already, which size takes out again.
	e.remaining, e.known = a.Remaining+n.drained(), true
	left := e.left
	sh.mu.Unlock()
	return Result{Extra: left}
}

// Forget drops the block of subject under the policy id (a Reset).
func (q *Quota) Forget(subject, id string) {
	sh := q.shard(subject)
	sh.mu.Lock()
	if e := sh.m[key{Subject: subject, Policy: id}]; e != nil {
		q.drop(e)
		e.known = false
		e.resets++ // a block being asked now was spent before the reset
	}
	sh.mu.Unlock()
}
