// Package memstore is the embedded sluice.Store: it runs the decision
// engine of sluice directly, in the process, under one lock per shard,
// keeping each state in a map.
//
// Use it for a single instance, for tests, and as the local fallback of a
// shared store. Every instance of an application keeps its own counts.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/period"
)

// Options configure a Store. The zero value means the defaults.
type Options struct {
	// Clock is the time source of every decision. Default: the system
	// clock read once by New and advanced from then on by the monotonic
	// clock, so it never steps when the system clock is adjusted.
	Clock sluice.Clock
	// Shards is the number of independently locked partitions, rounded up to
	// a power of two. Subjects are spread over them by a hash; all state of
	// one subject lives in one shard, so a multi-policy decision takes one
	// lock. Default: 64.
	Shards int
	// MaxKeys bounds the number of (subject, policy) states held, so a flood
	// of distinct subjects cannot exhaust memory. It is enforced per shard
	// (MaxKeys / Shards each, at least 1). At the bound, a new state looks
	// at a sample of 32 other subjects' states in its shard: the expired ones
	// go; if none had expired, the one with the most of its capacity left
	// is evicted, so an exhausted subject is the last to go (the
	// sweeper drops the rest of the expired ones). An evicted subject starts from
	// fresh state, so under such a flood its limit is approximate; Evictions
	// counts how often that happened. Remembered evaluation ids are bounded
	// by the same number, separately: expired ones go first, then the ids
	// of whole (subject, policy) pairs, counted apart by Evictions.
	//
	// Memory: filled once, each state takes about 240 bytes of heap and
	// each remembered id about 150–290 (290 when every subject has an id
	// of its own), with 43-byte subjects and 36-byte ids
	// (BenchmarkMemoryPerState). A flood that keeps evicting at the bound
	// costs more (maps stay large, spans half empty): 2 000 000 distinct
	// subjects at the default bound hold about 369 MiB of heap, and 868 MiB
	// when each request also carries an evaluation id that does not expire
	// (BenchmarkMemoryFlood); a sluice serve sent that flood peaks at
	// 483 MiB and 1 108 MiB resident (bench/flood). Lower MaxKeys to bound
	// it tighter: about 510 bytes of process memory per state at the bound,
	// and 650 more per remembered id.
	// Default: 1 000 000.
	MaxKeys int
	// MaxOverrides bounds the overrides the store holds (see
	// Store.PutOverride): it refuses to add one more, changing or
	// removing one still works. 0: no bound. Default: 0.
	MaxOverrides int
	// SweepInterval is how often a background goroutine drops expired
	// states (they are also dropped lazily when touched). Negative disables
	// the sweeper. Default: 1m.
	SweepInterval time.Duration
}

// Store is the embedded store. Create it with New; the zero value is not
// usable. Safe for concurrent use. Close stops its sweeper goroutine.
type Store struct {
	clock     sluice.Clock
	seed      maphash.Seed
	shards    []shard
	mask      uint64
	perShard  int
	evictions atomic.Int64 // live states dropped at the bound
	idsLost   atomic.Int64 // live remembered ids dropped at the bound
	periods   period.Cache // calendar periods' bounds around the clock
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	ovrMu     sync.Mutex
	ovr       map[[2]string]sluice.Override // policy, subject → override
	maxOvr    int                           // Options.MaxOverrides
}

var _ sluice.Store = (*Store)(nil)

// key identifies one policy's state for one subject.
type key struct {
	subject  string
	policy   string
	revision int64
	aligned  bool // a clock-aligned fixed window's state is another one
}

// keyOf is the key of p's state for subject.
func keyOf(subject string, p *sluice.Policy) key {
	return key{subject: subject, policy: p.ID, revision: p.Revision, aligned: p.ClockAligned}
}

// state is one policy's state for one subject, and the algorithm it was
// written by.
type state struct {
	kind algorithm.Kind
	// remaining and limit are the last write's Remaining (at least 0, at
	// most limit) and Limit: what losing the state gives away (left). Kept
	// as they are so a decision does not divide; only making room does.
	remaining, limit uint32
	expires          int64 // µs from which the state equals absent, under the numbers it was written with (for sweeping)
	st               algorithm.State
}

// entry is a state held in a shard, under its key. Its fields are in the
// order a decision reads them, the key first and the state's log and lease
// ids (which a GCRA never uses) last, so a decision touches as few of its
// cache lines as it can.
type entry struct {
	key  key
	next *entry // the next entry of the same subject hash
	state
}

// states are the entries of one shard, found by their subject's hash: the
// one that picked the shard, so a decision hashes its subject once (a map
// keyed by key would hash the subject again, and the policy ID). Each hash
// leads to a chain: the subject's states, one per policy, and those of any
// other subject with the same hash.
type states struct {
	m map[uint64]*entry
	n int // entries in all chains
}

// get returns the entry of k, whose subject hashes to h, or nil.
func (t *states) get(h uint64, k key) *entry {
	for en := t.m[h]; en != nil; en = en.next {
		if en.key == k {
			return en
		}
	}
	return nil
}

// add returns a new entry of fresh state for k, whose subject hashes to h
// and which t does not hold.
func (t *states) add(h uint64, k key) *entry {
	en := &entry{key: k, next: t.m[h]}
	t.m[h] = en
	t.n++
	return en
}

// remove drops en, which t holds under h.
func (t *states) remove(h uint64, en *entry) {
	t.n--
	head := t.m[h]
	if head == en {
		if en.next == nil {
			delete(t.m, h)
		} else {
			t.m[h] = en.next
		}
		return
	}
	for prev := head; prev != nil; prev = prev.next {
		if prev.next == en {
			prev.next = en.next
			return
		}
	}
}

type shard struct {
	mu     sync.Mutex
	states states
	dedupe map[key]*algorithm.DedupeLog // keyed by the first policy of a decision
	ids    int                          // records in all of dedupe, at most perShard
	work   work                         // the decision being taken, under mu
	_      [128]byte                    // keep neighbouring shards off each other's cache lines
}

// work is the room one decision takes: reused under the shard lock, so a
// decision neither allocates nor clears it. Room for two policies lies in
// the shard itself (its slices' arrays elsewhere on the heap would share
// cache lines with other shards' and slow parallel decisions down); more
// allocate.
type work struct {
	e      algorithm.Evaluation
	keys   []key
	stored []*entry

	policies  [2]algorithm.Policy
	states    [2]*algorithm.State
	decisions [2]algorithm.Decision
	writes    [2]algorithm.Write
	keyRoom   [2]key
	entries   [2]*entry
}

// reset readies w for a decision over n policies.
func (w *work) reset(n int) {
	if n <= len(w.policies) {
		w.e.Policies, w.e.States = w.policies[:0], w.states[:0]
		w.e.Decisions, w.e.Writes = w.decisions[:n], w.writes[:n]
		w.keys, w.stored = w.keyRoom[:0], w.entries[:0]
	} else {
		w.e.Policies, w.e.States = make([]algorithm.Policy, 0, n), make([]*algorithm.State, 0, n)
		w.e.Decisions, w.e.Writes = make([]algorithm.Decision, n), make([]algorithm.Write, n)
		w.keys, w.stored = make([]key, 0, n), make([]*entry, 0, n)
	}
	w.e.Replay, w.e.ReplayExtra, w.e.ReplayOthers, w.e.Estimate, w.e.Extra, w.e.Others = nil, nil, "", nil, w.e.Extra[:0], ""
}

// New returns a Store, starting its sweeper unless disabled.
func New(opts Options) (*Store, error) {
	if opts.Shards < 0 {
		return nil, fmt.Errorf("memstore: Shards = %d: must not be negative", opts.Shards)
	}
	if opts.MaxKeys < 0 {
		return nil, fmt.Errorf("memstore: MaxKeys = %d: must not be negative", opts.MaxKeys)
	}
	if opts.MaxOverrides < 0 {
		return nil, fmt.Errorf("memstore: MaxOverrides = %d: must not be negative", opts.MaxOverrides)
	}
	if opts.Clock == nil {
		opts.Clock = clock.NewMonotonic()
	}
	if opts.Shards == 0 {
		opts.Shards = 64
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = 1_000_000
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Minute
	}
	n := 1
	for n < opts.Shards {
		n <<= 1
	}
	s := &Store{
		clock:    opts.Clock,
		seed:     maphash.MakeSeed(),
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		perShard: max(opts.MaxKeys/n, 1),
		maxOvr:   opts.MaxOverrides,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].states.m = make(map[uint64]*entry)
		s.shards[i].dedupe = make(map[key]*algorithm.DedupeLog)
	}
	if opts.SweepInterval > 0 {
		go s.sweepLoop(opts.SweepInterval)
	} else {
		close(s.done)
	}
	return s, nil
}

// Close stops the sweeper and waits for it. The store still answers
// afterwards, reclaiming lazily only.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Len returns the number of states held, expired ones not yet dropped
// included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.states.n
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns, as states, how many live states were evicted at the MaxKeys
// bound: each such subject starts again from fresh state. Expired states
// dropped to make room (or by the sweeper) and remembered ids are not
// counted: with nothing expired, it is the number of states ever created
// minus Len.
//
// ids is how many remembered evaluation ids, not yet expired, were
// forgotten at the bound: a retry carrying one of them is decided again
// instead of replayed. Ids forgotten because they expired or because their
// log passed the policy's DedupeMax are not counted.
func (s *Store) Evictions() (states, ids int64) { return s.evictions.Load(), s.idsLost.Load() }

// Evaluate implements sluice.Store.
func (s *Store) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if evaluation.Short(ev) {
		return s.decideShort(ev)
	}
	if len(ev.Previous) > 0 {
		// Carrying state over writes before the decision: check first.
		if err := check(ev); err != nil {
			return err
		}
	}
	hold, err := evaluation.Span(ev)
	if err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	now := evaluation.Now(s.clock)
	var carried []*state
	switch {
	case len(ev.Previous) == 0:
	case ev.Op == sluice.Reset:
		s.forget(ev.Previous, ev.Policies)
	default:
		carried = s.previous(ev.Previous, ev.Policies)
	}
	h := maphash.String(s.seed, ev.Subject)
	sh := &s.shards[h&s.mask]
	id := algorithm.RecordID(ev.EvaluationID, evaluation.Op(ev))

	sh.mu.Lock()
	defer sh.mu.Unlock()
	w := &sh.work
	w.reset(len(ev.Policies))
	e := &w.e
	e.Now, e.Op, e.Cost, e.Hold, e.LeaseID, e.MaxRegression = now, evaluation.Op(ev), ev.Cost, hold, ev.LeaseID, -1
	s.gather(sh, h, now, ev, carried)
	ks := w.keys
	if id != "" {
		if e.Op == algorithm.OpEstimate || e.Op == algorithm.OpSettle {
			e.Others = others(e, ks)
		}
		lookup(sh.dedupe[ks[0]], e, ev.EvaluationID, id, now)
	}
	if len(ev.Previous) == 0 {
		// Nothing was written yet: check the policies as built.
		if err := algorithm.Check(e.Op, e.Policies, e.Cost, e.Hold, e.LeaseID, ev.EvaluationID != ""); err != nil {
			return fmt.Errorf("memstore: %w", err)
		}
	}
	if err := evaluate(e); err != nil {
		return engineError(err)
	}
	ev.Statuses = evaluation.Statuses(ev.Statuses, len(e.Decisions))
	for i := range e.Decisions {
		evaluation.SetStatus(&ev.Statuses[i], ev.Policies[i], &e.Decisions[i])
	}
	evaluation.SetSettled(ev.Statuses, e.Extra)
	ev.Replayed = e.Replayed
	if e.Replayed {
		return nil
	}
	if id != "" {
		s.remember(sh, now, ks[0], ev.Policies[0], id, e.Decisions, recordExtra(e), e.Others)
	}
	if e.Commit {
		for i := range e.Writes {
			s.put(sh, now, h, ks[i], w.stored[i], e.Policies[i].Kind, &e.Writes[i], &e.Decisions[i])
		}
	}
	return nil
}

// gather puts ev's policies, their keys and their states (nil: absent)
// in sh's work, under sh's lock, taking the states carried over from an
// older subject (carried, when not nil) where ev's subject has none.
func (s *Store) gather(sh *shard, h uint64, now int64, ev *sluice.Evaluation, carried []*state) {
	w := &sh.work
	e := &w.e
	for i, p := range ev.Policies {
		k := keyOf(ev.Subject, p)
		ap := evaluation.PolicyAt(p, now, &s.periods)
		ap.Params.Reserve = int32(evaluation.Reserve(p, ev.Priority, evaluation.Op(ev))) // below MaxLimit
		en := sh.states.get(h, k)
		if carried != nil && carried[i] != nil && !ap.Live(stateOf(en, ap.Kind), now) {
			// Carried over from an older subject: kept from now on.
			if en == nil {
				if sh.states.n >= s.perShard {
					s.makeRoom(sh, now, k.subject)
				}
				en = sh.states.add(h, k)
			}
			en.state = *carried[i]
		}
		st := stateOf(en, ap.Kind)
		w.keys, w.stored = append(w.keys, k), append(w.stored, en)
		e.Policies, e.States = append(e.Policies, ap), append(e.States, st)
	}
}

// engineError wraps err, from the engine's Evaluate or DecideOne: a
// *algorithm.ClockError (a calendar period's state written beyond the
// periods around the clock, after it stepped back) is sluice.ClockUnsafe.
func engineError(err error) error {
	if errors.As(err, new(*algorithm.ClockError)) {
		return fmt.Errorf("memstore: %w: %w", err, sluice.ClockUnsafe)
	}
	return fmt.Errorf("memstore: %w", err)
}

// stateOf returns the state of en, an entry of a policy of kind (nil:
// none), or nil: another algorithm's state under the same revision is
// absent.
func stateOf(en *entry, kind algorithm.Kind) *algorithm.State {
	if en == nil || en.kind != kind {
		return nil
	}
	return &en.st
}

// check reports whether ev breaks a rule of its operation, before any
// state is read or written (room for two policies on the stack: most
// decisions name one).
func check(ev *sluice.Evaluation) error {
	var room [2]algorithm.Policy
	if err := evaluation.Check(ev, room[:]); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	return nil
}

// previous returns, for each policy, a copy of the live state kept under
// the first of subjects that has one, or nil; nil when there is none at
// all. It locks one shard at a time.
func (s *Store) previous(subjects []string, policies []*sluice.Policy) []*state {
	var out []*state
	now := evaluation.Now(s.clock)
	for _, subject := range subjects {
		h := maphash.String(s.seed, subject)
		sh := &s.shards[h&s.mask]
		sh.mu.Lock()
		for i, p := range policies {
			if out != nil && out[i] != nil {
				continue
			}
			ap := evaluation.PolicyAt(p, now, &s.periods)
			en := sh.states.get(h, keyOf(subject, p))
			if !ap.Live(stateOf(en, ap.Kind), now) {
				continue
			}
			if out == nil {
				out = make([]*state, len(policies))
			}
			c := en.state
			c.st.Log = append([]int64(nil), en.st.Log...)
			c.st.IDs = append([]string(nil), en.st.IDs...) // a concurrency policy's lease ids
			out[i] = &c
		}
		sh.mu.Unlock()
	}
	return out
}

// forget deletes the state of policies kept under each of subjects, one
// shard at a time.
func (s *Store) forget(subjects []string, policies []*sluice.Policy) {
	for _, subject := range subjects {
		h := maphash.String(s.seed, subject)
		sh := &s.shards[h&s.mask]
		sh.mu.Lock()
		for _, p := range policies {
			if en := sh.states.get(h, keyOf(subject, p)); en != nil {
				sh.states.remove(h, en)
			}
		}
		sh.mu.Unlock()
	}
}

// remember records decisions as the decision for id (sh locked). The
// shard holds at most perShard records in all: beyond, expired ones go
// first, then whole logs, the soonest-expiring of a sample.
func (s *Store) remember(sh *shard, now int64, dk key, p *sluice.Policy, id string, decisions []algorithm.Decision, extra []int64, others string) {
	l := sh.dedupe[dk]
	if l == nil {
		l = &algorithm.DedupeLog{}
		sh.dedupe[dk] = l
	}
	sh.ids += l.RememberRecord(id, now, p.DedupeTTL.Microseconds(), p.DedupeMax, decisions, extra, others)
	if sh.ids > s.perShard {
		s.makeDedupeRoom(sh, now, l)
	}
}

// makeDedupeRoom brings sh (locked) back to perShard records, looking at
// samples of its logs other than keep: their expired records go first (a
// log left empty goes too); if that freed nothing, the log whose newest
// record expires soonest is evicted whole. As a last resort keep's own
// oldest records go.
func (s *Store) makeDedupeRoom(sh *shard, now int64, keep *algorithm.DedupeLog) {
	for sh.ids > s.perShard {
		var victim key
		found, freed := false, false
		soonest := int64(0)
		sampled := 0
		for k, l := range sh.dedupe {
			if l == keep {
				continue
			}
			if n := l.Prune(now, l.Len()); n > 0 {
				sh.ids -= n
				freed = true
			}
			if l.Len() == 0 {
				delete(sh.dedupe, k)
			} else if e := l.Newest(); !found || e < soonest {
				victim, soonest, found = k, e, true
			}
			if sampled++; sampled == roomSample {
				break
			}
		}
		switch {
		case freed:
		case found:
			n := sh.dedupe[victim].Len() // none expired: just pruned
			sh.ids -= n
			delete(sh.dedupe, victim)
			s.idsLost.Add(int64(n))
		default:
			// keep was pruned of its expired records at now: all live.
			n := keep.Prune(now, s.perShard)
			sh.ids -= n
			s.idsLost.Add(int64(n))
			return
		}
	}
}

// sweepDedupe forgets expired records and empty logs (sh locked).
func sweepDedupe(sh *shard, now int64) {
	for k, l := range sh.dedupe {
		if sh.ids -= l.Prune(now, l.Len()); l.Len() == 0 {
			delete(sh.dedupe, k)
		}
	}
}

// put keeps the state w describes for k, whose subject hashes to h, in sh
// (locked): over en, the entry stored under k (nil when there is none), or
// as a new entry, enforcing the per-shard bound. Only a new key allocates.
func (s *Store) put(sh *shard, now int64, h uint64, k key, en *entry, kind algorithm.Kind, w *algorithm.Write, d *algorithm.Decision) {
	switch {
	case w.Expires <= now:
		if en != nil {
			sh.states.remove(h, en)
		}
		return
	case en == nil:
		if sh.states.n >= s.perShard {
			s.makeRoom(sh, now, k.subject)
		}
		en = sh.states.add(h, k)
	}
	en.kind, en.expires = kind, w.Expires
	en.remaining, en.limit = uint32(min(max(d.Remaining, 0), d.Limit)), uint32(d.Limit) // Limit ≤ algorithm.MaxLimit
	en.st.Apply(w)
}

// left returns the share of its capacity the state had left after its last
// write, in 1/65535.
func (s *state) left() uint16 {
	return uint16(int64(s.remaining) * 65535 / max(int64(s.limit), 1))
}

// roomSample is how many entries making room looks at: bounded, so a
// decision at the bound costs the same however large the shard is.
const roomSample = 32

// makeRoom frees at least one slot in sh (locked) by looking at a sample of
// its states (map iteration starts at a random entry): the expired ones in
// it go; if none had expired, the one whose loss gives away least is
// evicted: the one with the largest share of its capacity left (then the
// one expiring soonest), so a flood of new subjects evicts fresh states
// before a subject that is being denied. A sample of nothing but
// exhausted states looks further, up to four samples. States of subject, the one being
// decided, are never touched, so a multi-policy decision cannot lose what
// it is writing.
func (s *Store) makeRoom(sh *shard, now int64, subject string) {
	var victim *entry
	var victimHash uint64
	var victimLeft uint16
	freed := false
	sampled := 0
sample:
	for h, head := range sh.states.m {
		for e := head; e != nil; {
			next := e.next
			if e.key.subject == subject {
				e = next
				continue
			}
			if e.expires <= now {
				sh.states.remove(h, e)
				freed = true
			} else if left := e.left(); victim == nil || left > victimLeft || left == victimLeft && e.expires < victim.expires {
				victim, victimHash, victimLeft = e, h, left
			}
			sampled++
			// A sample whose best candidate has nothing left (a subject
			// being denied) looks further, up to four samples, for one
			// that gives away less.
			if sampled%roomSample == 0 && (victim == nil || victimLeft > 0 || sampled == 4*roomSample) {
				break sample
			}
			e = next
		}
	}
	if !freed && victim != nil {
		sh.states.remove(victimHash, victim)
		s.evictions.Add(1)
	}
}

// sweepShard drops sh's expired states (sh locked) and returns how many.
func sweepShard(sh *shard, now int64) int {
	n := 0
	for h, head := range sh.states.m {
		for e := head; e != nil; {
			next := e.next
			if e.expires <= now {
				sh.states.remove(h, e)
				n++
			}
			e = next
		}
	}
	return n
}

// sweep drops every expired state now, forgets expired evaluation ids, and
// returns how many states it dropped: the background sweeper's round.
func (s *Store) sweep() int {
	now := evaluation.Now(s.clock)
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sweepShard(sh, now)
		sweepDedupe(sh, now)
		sh.mu.Unlock()
	}
	return n
}

func (s *Store) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}
