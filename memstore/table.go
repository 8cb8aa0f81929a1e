package memstore

import (
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

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
