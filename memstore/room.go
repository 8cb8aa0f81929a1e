package memstore

import (
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
)

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
