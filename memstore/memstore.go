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
