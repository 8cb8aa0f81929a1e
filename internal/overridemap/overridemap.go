// Package overridemap is the bookkeeping of a Limiter's tenant overrides
// for the root's overrides stage (sluice's overrides.go): the snapshot a
// Check looks a subject's numbers up in, a persistent hash trie (Map) so
// that setting one override among many copies a few nodes, not the whole
// map; the overrides set on the Limiter and read from its store, the
// ones given at New under them; and when to read the store's again
// (age.go). It knows nothing of overrides or policies but what the
// stage hands it: O is an override (compared by ==), P what one
// resolves to (the overridden policy).
package overridemap

import (
	"context"
	"hash/maphash"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Timings: no decision is taken on overrides read from the store longer
// than MaxAge ago (on the Limiter's clock, counted from when the last
// read that succeeded began; a failed read does not count): a Check that
// finds them older reads them first, and decides on the ones in hand
// only when that read fails or outlasts half its deadline. A Check that
// finds them older than half that starts one background read, so a busy
// Limiter never waits for one. A read gives up after ReadTimeout.
const (
	MaxAge      = 500 * time.Millisecond
	ReadTimeout = 2 * time.Second
)

// Entry is an override in the snapshot and what it resolves to.
type Entry[O, P any] struct {
	O O
	P P
}

// Config is what a State is made of.
type Config[O comparable, P any] struct {
	// Key names o's policy and subject.
	Key func(o O) Key
	// Resolve returns what o resolves to, false when o cannot apply (a
	// policy the Limiter lacks, numbers it refuses): o is then left out
	// of the snapshot.
	Resolve func(o O) (P, bool)
	// Read reads the store's overrides; nil when the store keeps none.
	Read func(ctx context.Context) ([]O, error)
	// Clock is the Limiter's.
	Clock Clock
}

// State is a Limiter's overrides. Safe for concurrent use.
type State[O comparable, P any] struct {
	cfg     Config[O, P]
	set     atomic.Pointer[Map[Entry[O, P]]] // the snapshot Checks look up
	age     Freshness                        // how old the store's overrides are
	mu      sync.Mutex                       // held to change stored, set and changes
	local   *Map[Entry[O, P]]                // the ones given at New: applied under the others
	stored  []O                              // the store's, as last read
	dirty   bool                             // a Set since: stored is not what the snapshot holds
	changes int64                            // Set calls: a read begun before one is stale
	reads   int64                            // reads begun
	applied int64                            // the latest read applied (its number in reads): an older one is dropped
}

// New returns the State of cfg with local (given at New, each resolved
// by the caller: ps[i] is local[i]'s) under the store's. With a store
// (cfg.Read), a first read starts now, in the background: the first
// Check waits for it, not longer.
func New[O comparable, P any](cfg Config[O, P], local []O, ps []P) *State[O, P] {
	s := &State[O, P]{cfg: cfg}
	seed := maphash.MakeSeed()
	keys, entries := make([]Key, len(local)), make([]Entry[O, P], len(local))
	for i, o := range local {
		keys[i], entries[i] = cfg.Key(o), Entry[O, P]{O: o, P: ps[i]}
	}
	s.local = Build(seed, keys, entries)
	s.set.Store(s.local)
	if cfg.Read != nil {
		s.age.Init(cfg.Clock, MaxAge)
		s.read()
	}
	return s
}

// Fresh returns the overrides a Check applies now, fresh enough to
// decide on: over a store that keeps overrides, it starts a background
// read when they are old, and when they are stale waits for one, for at
// most half the
// time ctx has left (on the Limiter's clock): a store that slow to give
// its overrides is most likely failing, and the decision, sent to it
// with the other half, says how (and feeds its breaker) where a Check
// that spent its whole deadline waiting here would say nothing of the
// store. Such a decision goes on the overrides in hand.
func (s *State[O, P]) Fresh(ctx context.Context) *Map[Entry[O, P]] {
	if s.cfg.Read != nil {
		s.await(ctx)
	}
	return s.set.Load()
}

// await is Fresh's wait over a store that keeps overrides. After a
// failed read, a Check that finds them stale reads them itself rather
// than wait for the read under way: over a store that hangs, that read
// may hang past the moment the store's breaker opens and would shed this
// Check at once, while the Check's own read meets the open breaker too;
// and once the store answers again, every Check reads the overrides it
// decides on (one round trip each, until one read succeeds and the
// overrides are fresh again).
func (s *State[O, P]) await(ctx context.Context) {
	switch s.age.State() {
	case Old:
		s.read()
	case Stale:
		ctx, cancel := s.half(ctx)
		defer cancel()
		if s.age.Failing() {
			s.readOwn(ctx)
			return
		}
		select {
		case <-s.read():
		case <-ctx.Done():
		}
	}
}

// half returns ctx bounded to half the time it has left, on the
// Limiter's clock.
func (s *State[O, P]) half(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	now := s.cfg.Clock.Now()
	return context.WithDeadline(ctx, now.Add(dl.Sub(now)/2))
}

// readOwn reads the store's overrides for one Check, within ctx and
// ReadTimeout, and records the read.
func (s *State[O, P]) readOwn(ctx context.Context) {
	began := s.cfg.Clock.Now()
	ctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	applied, err := s.ReadNow(ctx)
	cancel()
	s.age.Record(err == nil && applied, began, s.cfg.Clock.Now())
}

// read starts one read of the store's overrides, unless one is under
// way, and returns a channel closed when the read under way ends.
func (s *State[O, P]) read() <-chan struct{} {
	ch, start := s.age.Begin()
	if !start {
		return ch
	}
	go func() {
		began := s.cfg.Clock.Now()
		ctx, cancel := context.WithTimeout(context.Background(), ReadTimeout)
		applied, err := s.ReadNow(ctx)
		cancel()
		s.age.End(ch, err == nil && applied, began, s.cfg.Clock.Now())
	}()
	return ch
}

// ReadNow reads the store's overrides now and applies them, building a
// new snapshot only when they changed, and reports whether it applied
// them: a read that a later Set, or a read begun after it, overtook is
// dropped.
func (s *State[O, P]) ReadNow(ctx context.Context) (bool, error) {
	s.mu.Lock()
	changes := s.changes
	s.reads++
	n := s.reads
	s.mu.Unlock()
	list, err := s.cfg.Read(ctx)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if changes != s.changes || n < s.applied {
		return false, nil
	}
	s.applied = n
	if !s.same(list) {
		s.replace(list)
	}
	return true, nil
}

// same reports whether list is what the snapshot holds of the store's:
// the list last read, with no Set since.
func (s *State[O, P]) same(list []O) bool {
	return !s.dirty && slices.Equal(list, s.stored)
}

// replace makes list the stored overrides and rebuilds the snapshot: the
// local ones, then the stored ones over them. An override unchanged since
// the last snapshot keeps what it resolved to. s.mu is held.
func (s *State[O, P]) replace(list []O) {
	old := s.set.Load()
	s.stored, s.dirty = append([]O(nil), list...), false
	keys, entries := make([]Key, 0, s.local.Len()+len(list)), make([]Entry[O, P], 0, s.local.Len()+len(list))
	s.local.Range(func(k Key, e Entry[O, P]) {
		keys, entries = append(keys, k), append(entries, e)
	})
	for _, o := range list {
		k := s.cfg.Key(o)
		e, ok := old.Get(k)
		if !ok || e.O != o {
			if e.P, ok = s.cfg.Resolve(o); !ok {
				continue // one the store holds for a policy the Limiter lacks
			}
			e.O = o
		}
		keys, entries = append(keys, k), append(entries, e)
	}
	s.set.Store(Build(old.seed, keys, entries))
}

// Set applies o at once, resolved to p, or with remove drops the one of
// its policy and subject (the one given at New shows again), after put
// (when not nil: the store's write) succeeds, which runs under the
// State's lock so that writes and snapshots keep one order.
func (s *State[O, P]) Set(o O, p P, remove bool, put func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if put != nil {
		if err := put(); err != nil {
			return err
		}
	}
	k, set := s.cfg.Key(o), s.set.Load()
	if remove {
		if e, ok := s.local.Get(k); ok {
			set = set.With(k, e)
		} else {
			set = set.Without(k)
		}
	} else {
		set = set.With(k, Entry[O, P]{O: o, P: p})
	}
	s.changes, s.dirty = s.changes+1, true
	s.set.Store(set)
	return nil
}

// List returns the overrides of the snapshot, by policy then subject.
func (s *State[O, P]) List() []O {
	type keyed struct {
		k Key
		o O
	}
	var all []keyed
	s.set.Load().Range(func(k Key, e Entry[O, P]) { all = append(all, keyed{k, e.O}) })
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i].k, all[j].k
		return a.Policy < b.Policy || a.Policy == b.Policy && a.Subject < b.Subject
	})
	if len(all) == 0 {
		return nil
	}
	list := make([]O, len(all))
	for i, x := range all {
		list[i] = x.o
	}
	return list
}
