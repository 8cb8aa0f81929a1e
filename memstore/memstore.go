// Package memstore is the embedded sluice.Store: it runs the algorithm math
// of sluice directly, in the process, under one lock per shard.
//
// Use it for a single instance, for tests, and as the local fallback of a
// shared store. Every instance of an application keeps its own counts.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algorithm"
)

// Options configure a Store. The zero value means the defaults.
type Options struct {
	// Clock is the time source of every decision. Default: a
	// sluice.MonotonicClock started by New, which never steps when the
	// system clock is adjusted.
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
	// go; if none had expired, the one expiring soonest is evicted (the
	// sweeper drops the rest of the expired ones). An evicted subject starts from
	// fresh state, so under such a flood its limit is approximate; Evictions
	// counts how often that happened. Remembered evaluation ids are bounded
	// by the same number, separately: expired ones go first, then the ids
	// of whole (subject, policy) pairs. Default: 1 000 000.
	MaxKeys int
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
	evictions atomic.Int64
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ sluice.Store = (*Store)(nil)

// key identifies one policy's state for one subject.
type key struct {
	subject  string
	policy   string
	revision int64
}

// entry is one state. Exactly the fields of its kind are meaningful: a
// [5]int64 holds the fixed-size states, log the sliding log.
type entry struct {
	kind    algorithm.Kind
	expires int64 // µs from which the state equals absent, under the numbers it was written with (for sweeping)
	v       [5]int64
	log     []int64
}

type shard struct {
	mu     sync.Mutex
	m      map[key]*entry     // pointers: an existing key costs one lookup
	dedupe map[key]*dedupeLog // keyed by the first policy of a decision
	ids    int                // records in all of dedupe, at most perShard
	_      [32]byte           // keep neighbouring shards' locks off one cache line
}

// dedupeLog remembers the decisions taken for evaluation ids of one subject
// and policy, oldest first.
type dedupeLog struct {
	records map[string]dedupeRecord
	order   []string // ids in the order recorded; expiries ascend with it
}

type dedupeRecord struct {
	expires  int64 // µs
	statuses []sluice.Status
}

// newest returns the expiry of the most recent record.
func (l *dedupeLog) newest() int64 {
	if len(l.order) == 0 {
		return 0
	}
	return l.records[l.order[len(l.order)-1]].expires
}

// prune forgets expired records, and the oldest beyond max, and returns
// how many it forgot.
func (l *dedupeLog) prune(now int64, max int) int {
	drop := 0
	for drop < len(l.order) && (l.records[l.order[drop]].expires <= now || len(l.order)-drop > max) {
		delete(l.records, l.order[drop])
		drop++
	}
	l.order = l.order[drop:]
	return drop
}

// New returns a Store, starting its sweeper unless disabled.
func New(opts Options) (*Store, error) {
	if opts.Shards < 0 {
		return nil, fmt.Errorf("memstore: Shards = %d: must not be negative", opts.Shards)
	}
	if opts.MaxKeys < 0 {
		return nil, fmt.Errorf("memstore: MaxKeys = %d: must not be negative", opts.MaxKeys)
	}
	if opts.Clock == nil {
		opts.Clock = sluice.NewMonotonicClock()
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
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[key]*entry)
		s.shards[i].dedupe = make(map[key]*dedupeLog)
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
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many live states were evicted at the MaxKeys bound.
func (s *Store) Evictions() int64 { return s.evictions.Load() }

// pending is one policy's decided state, written only if the whole
// decision admits: over stored (nil when the key holds nothing), or as a
// new key.
type pending struct {
	k      key
	stored *entry
	e      entry
}

// Evaluate implements sluice.Store.
func (s *Store) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(ev.Policies) == 0 {
		return fmt.Errorf("memstore: %w: no policies", sluice.ErrInvalidRequest)
	}
	now := sluice.UnixMicro(s.clock)
	sh := &s.shards[maphash.String(s.seed, ev.Subject)&s.mask]
	var buf [2]pending
	decided := buf[:0]
	ev.Statuses = ev.Statuses[:0]
	ev.Replayed = false
	allowed := true

	sh.mu.Lock()
	defer sh.mu.Unlock()
	var dk key
	var dedupeID string
	if ev.EvaluationID != "" && ev.Cost > 0 {
		first := ev.Policies[0]
		dk = key{subject: ev.Subject, policy: first.ID, revision: first.Revision}
		dedupeID = "s:" + ev.EvaluationID
		if ev.Refund {
			dedupeID = "r:" + ev.EvaluationID
		}
		if l := sh.dedupe[dk]; l != nil {
			if r, ok := l.records[dedupeID]; ok && r.expires > now {
				if len(r.statuses) != len(ev.Policies) {
					return fmt.Errorf("memstore: %w: evaluation id %q was first used with %d policies, now with %d", sluice.ErrInvalidRequest, ev.EvaluationID, len(r.statuses), len(ev.Policies))
				}
				ev.Statuses = append(ev.Statuses, r.statuses...)
				ev.Replayed = true
				return nil
			}
		}
	}
	for _, p := range ev.Policies {
		k := key{subject: ev.Subject, policy: p.ID, revision: p.Revision}
		decided = append(decided, pending{k: k, stored: sh.m[k]})
		pd := &decided[len(decided)-1]
		prm := params(p)
		pd.e = current(pd.stored, algorithm.Kind(p.Algorithm), prm, now)
		d := step(&pd.e, prm, now, ev.Cost, ev.Refund)
		if !d.Allowed {
			allowed = false
		}
		ev.Statuses = append(ev.Statuses, sluice.StatusFromMicros(p, d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter))
	}
	if !allowed && len(ev.Policies) > 1 {
		// Nothing is spent: a policy that would have admitted reports its
		// unspent state, as a peek does, still admitting the cost.
		for i, p := range ev.Policies {
			if ev.Statuses[i].Allowed {
				prm := params(p)
				e := current(decided[i].stored, algorithm.Kind(p.Algorithm), prm, now)
				d := step(&e, prm, now, 0, false)
				ev.Statuses[i] = sluice.StatusFromMicros(p, true, d.Limit, d.Remaining, d.ResetAfter, 0)
			}
		}
	}
	if dedupeID != "" {
		s.remember(sh, now, dk, ev.Policies[0], dedupeID, ev.Statuses)
	}
	if !allowed || ev.Cost == 0 {
		return nil
	}
	for i := range decided {
		s.put(sh, now, &decided[i])
	}
	return nil
}

// remember records statuses as the decision for id (sh locked). The
// shard holds at most perShard records in all: beyond, expired ones go
// first, then whole logs, the soonest-expiring of a sample.
func (s *Store) remember(sh *shard, now int64, dk key, p *sluice.Policy, id string, statuses []sluice.Status) {
	l := sh.dedupe[dk]
	if l == nil {
		l = &dedupeLog{records: make(map[string]dedupeRecord)}
		sh.dedupe[dk] = l
	}
	// Forget expired records first. A live id would have been replayed, so
	// id is new or expired, and goes to the back.
	sh.ids -= l.prune(now, p.DedupeMax)
	if _, stale := l.records[id]; stale {
		// Expired but behind a longer-lived record (DedupeTTL changed).
		l.order = slices.DeleteFunc(l.order, func(x string) bool { return x == id })
		delete(l.records, id)
		sh.ids--
	}
	l.order = append(l.order, id)
	l.records[id] = dedupeRecord{expires: now + p.DedupeTTL.Microseconds(), statuses: append([]sluice.Status(nil), statuses...)}
	sh.ids++
	sh.ids -= l.prune(now, p.DedupeMax)
	if sh.ids > s.perShard {
		s.makeDedupeRoom(sh, now, l)
	}
}

// makeDedupeRoom brings sh (locked) back to perShard records, looking at
// samples of its logs other than keep: their expired records go first (a
// log left empty goes too); if that freed nothing, the log whose newest
// record expires soonest is evicted whole. As a last resort keep's own
// oldest records go.
func (s *Store) makeDedupeRoom(sh *shard, now int64, keep *dedupeLog) {
	for sh.ids > s.perShard {
		var victim key
		found, freed := false, false
		soonest := int64(0)
		sampled := 0
		for k, l := range sh.dedupe {
			if l == keep {
				continue
			}
			if n := l.prune(now, len(l.order)); n > 0 {
				sh.ids -= n
				freed = true
			}
			if len(l.order) == 0 {
				delete(sh.dedupe, k)
			} else if e := l.newest(); !found || e < soonest {
				victim, soonest, found = k, e, true
			}
			if sampled++; sampled == roomSample {
				break
			}
		}
		switch {
		case freed:
		case found:
			sh.ids -= len(sh.dedupe[victim].order)
			delete(sh.dedupe, victim)
			s.evictions.Add(1)
		default:
			sh.ids -= keep.prune(now, s.perShard)
			return
		}
	}
}

// sweepDedupe forgets expired records and empty logs (sh locked).
func sweepDedupe(sh *shard, now int64) {
	for k, l := range sh.dedupe {
		if sh.ids -= l.prune(now, len(l.order)); len(l.order) == 0 {
			delete(sh.dedupe, k)
		}
	}
}

// current returns a copy of the stored state as of now: a fresh one when
// there is none, it expired (under p, which may differ from the numbers it
// was written under), or it was written by another algorithm under the
// same revision.
func current(stored *entry, kind algorithm.Kind, p algorithm.Params, now int64) entry {
	if stored == nil {
		return entry{kind: kind}
	}
	if stored.kind != kind || now >= stored.expiresUnder(p) {
		return entry{kind: kind, log: stored.log[:0]}
	}
	return *stored
}

func params(p *sluice.Policy) algorithm.Params {
	return algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst}
}

// The states of the fixed-size algorithms, to and from an entry's v.
func (e *entry) fixedWindow() algorithm.FixedWindow {
	return algorithm.FixedWindow{Start: e.v[0], Count: e.v[1]}
}

func (e *entry) slidingWindow() algorithm.SlidingWindow {
	return algorithm.SlidingWindow{Start: e.v[0], Curr: e.v[1], Prev: e.v[2]}
}

func (e *entry) tokenBucket() algorithm.TokenBucket {
	return algorithm.TokenBucket{Tokens: e.v[0], Last: e.v[1], Window: e.v[2]}
}

func (e *entry) gcra() algorithm.GCRA {
	return algorithm.GCRA{TAT: e.v[0], Frac: e.v[1], Limit: e.v[2], Window: e.v[3], Last: e.v[4]}
}

// expiresUnder returns when e equals absent under p.
func (e *entry) expiresUnder(p algorithm.Params) int64 {
	switch e.kind {
	case algorithm.KindFixedWindow:
		return e.fixedWindow().Expires(p)
	case algorithm.KindSlidingLog:
		return algorithm.SlidingLog{Entries: e.log}.Expires(p)
	case algorithm.KindSlidingWindow:
		return e.slidingWindow().Expires(p)
	case algorithm.KindTokenBucket:
		return e.tokenBucket().Expires(p)
	case algorithm.KindGCRA:
		return e.gcra().Expires(p)
	}
	return 0
}

// step runs the algorithm of e.kind on e in place, deciding cost, or with
// refund set giving n back, and returns the verdict.
func step(e *entry, p algorithm.Params, now, n int64, refund bool) algorithm.Decision {
	var d algorithm.Decision
	switch e.kind {
	case algorithm.KindFixedWindow:
		st := e.fixedWindow()
		if refund {
			st, d = st.Refund(p, now, n)
		} else {
			st, d = st.Decide(p, now, n)
		}
		e.v = [5]int64{st.Start, st.Count}
	case algorithm.KindSlidingLog:
		st := algorithm.SlidingLog{Entries: e.log}
		if refund {
			st, d = st.Refund(p, now, n)
		} else {
			st, d = st.Decide(p, now, n)
		}
		e.log = st.Entries
	case algorithm.KindSlidingWindow:
		// No Refund (Limiter refuses it first): a refund would only peek.
		st := e.slidingWindow()
		if refund {
			_, d = st.Decide(p, now, 0)
		} else {
			st, d = st.Decide(p, now, n)
		}
		e.v = [5]int64{st.Start, st.Curr, st.Prev}
	case algorithm.KindTokenBucket:
		st := e.tokenBucket()
		if refund {
			st, d = st.Refund(p, now, n)
		} else {
			st, d = st.Decide(p, now, n)
		}
		e.v = [5]int64{st.Tokens, st.Last, st.Window}
	case algorithm.KindGCRA:
		st := e.gcra()
		if refund {
			st, d = st.Refund(p, now, n)
		} else {
			st, d = st.Decide(p, now, n)
		}
		e.v = [5]int64{st.TAT, st.Frac, st.Limit, st.Window, st.Last}
	}
	e.expires = e.expiresUnder(p)
	return d
}

// put writes a decided state in sh (locked), enforcing the per-shard bound.
// Only a new key allocates.
func (s *Store) put(sh *shard, now int64, pd *pending) {
	switch {
	case pd.e.expires <= now:
		if pd.stored != nil {
			delete(sh.m, pd.k)
		}
	case pd.stored != nil:
		*pd.stored = pd.e
	default:
		if len(sh.m) >= s.perShard {
			s.makeRoom(sh, now, pd.k.subject)
		}
		e := pd.e
		sh.m[pd.k] = &e
	}
}

// roomSample is how many entries making room looks at: bounded, so a
// decision at the bound costs the same however large the shard is.
const roomSample = 32

// makeRoom frees at least one slot in sh (locked) by looking at a sample of
// its states (map iteration starts at a random entry): the expired ones in
// it go; if none had expired, the one expiring soonest is evicted. States
// of subject, the one being decided, are never touched, so a multi-policy
// decision cannot lose what it is writing.
func (s *Store) makeRoom(sh *shard, now int64, subject string) {
	var victim key
	found, freed := false, false
	soonest := int64(0)
	sampled := 0
	for k, e := range sh.m {
		if k.subject == subject {
			continue
		}
		if e.expires <= now {
			delete(sh.m, k)
			freed = true
		} else if !found || e.expires < soonest {
			victim, soonest, found = k, e.expires, true
		}
		if sampled++; sampled == roomSample {
			break
		}
	}
	if !freed && found {
		delete(sh.m, victim)
		s.evictions.Add(1)
	}
}

// sweepShard drops sh's expired states (sh locked) and returns how many.
func sweepShard(sh *shard, now int64) int {
	n := 0
	for k, e := range sh.m {
		if e.expires <= now {
			delete(sh.m, k)
			n++
		}
	}
	return n
}

// Sweep drops every expired state now, forgets expired evaluation ids, and
// returns how many states it dropped. The background sweeper calls it;
// tests and callers with the sweeper disabled may too.
func (s *Store) Sweep() int {
	now := sluice.UnixMicro(s.clock)
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
			s.Sweep()
		}
	}
}
