package memstore

import (
	"fmt"
	"hash/maphash"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// decideShort takes a decision in the short form (evaluation.Short: one
// policy; a spend, held or not, or a peek of a rate policy, an acquire or
// a release of a concurrency one; no evaluation id, older subject or
// book). It does what Evaluate's general course does for it, by the
// engine's Check and DecideOne, without building an Evaluation: the state
// is read and written in place under the shard's lock.
// TestShortMatchesGeneral holds the two to the same answers.
func (s *Store) decideShort(ev *sluice.Evaluation) error {
	p := ev.Policies[0]
	hold := int64(0)
	if ev.Hold != 0 {
		// A held spend has rules of its own (a whole number of µs among
		// them): check them as the general course does.
		if err := check(ev); err != nil {
			return err
		}
		hold = int64(ev.Hold / time.Microsecond)
	}
	now := evaluation.Now(s.clock)
	var aps [1]algorithm.Policy // Check's slice, on the stack
	ap := &aps[0]
	evaluation.SetPolicyAt(ap, p, now, &s.periods)
	op := evaluation.Op(ev)
	if len(p.Priorities) != 0 {
		ap.Params.Reserve = int32(evaluation.Reserve(p, ev.Priority, op)) // below MaxLimit
	}
	if err := algorithm.Check(op, aps[:], ev.Cost, hold, ev.LeaseID, false); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	h := maphash.String(s.seed, ev.Subject)
	sh := &s.shards[h&s.mask]
	k := keyOf(ev.Subject, p)
	var d algorithm.Decision
	var w algorithm.Write // on the stack: the shard's work would be one more cache line to take from the core that locked it last
	sh.mu.Lock()
	en := sh.states.get(h, k)
	st := stateOf(en, ap.Kind)
	commit, err := algorithm.DecideOne(ap, st, now, -1, op, ev.Cost, hold, ev.LeaseID, &w, &d)
	if commit {
		s.put(sh, now, h, k, en, ap.Kind, &w, &d)
	}
	sh.mu.Unlock()
	if err != nil {
		return engineError(err)
	}
	ev.Statuses = evaluation.Statuses(ev.Statuses, 1)
	evaluation.SetStatus(&ev.Statuses[0], p, &d)
	ev.Replayed = false
	return nil
}
