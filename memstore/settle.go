package memstore

import (
	"strconv"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// lookup hands e what l (nil: nothing remembered) holds for its
// evaluation id, whose record id is id: the decision to replay, and for an
// estimate or a settle what algorithm.LookupFor reads (a settle's Extra,
// the estimate it settles).
func lookup(l *algorithm.DedupeLog, e *algorithm.Evaluation, evaluationID, id string, now int64) {
	switch {
	case l == nil:
	case e.Op != algorithm.OpSettle && e.Op != algorithm.OpEstimate:
		e.Replay = l.Lookup(id, now)
	default:
		algorithm.LookupFor(e, evaluationID, id, func(id string) (algorithm.Record, bool) { return l.LookupRecord(id, now) })
	}
}

// evaluate decides e by the engine: EvaluateSettle for a settle, Evaluate
// for every other operation.
func evaluate(e *algorithm.Evaluation) error {
	if e.Op == algorithm.OpSettle {
		return algorithm.EvaluateSettle(e)
	}
	return algorithm.Evaluate(e)
}

// recordExtra returns what the store remembers beside e's decisions
// (algorithm.Record.Extra): an estimate's cost and time, a settle's
// Settled values; nil for every other operation.
func recordExtra(e *algorithm.Evaluation) []int64 {
	switch e.Op {
	case algorithm.OpEstimate:
		return algorithm.EstimateExtra(e.Cost, e.Now)
	case algorithm.OpSettle:
		return e.Extra
	}
	return nil
}

// others returns algorithm.Others of e, an estimate or a settle, whose
// states ks key (e.Policies' keys, in order): each state named by its
// policy id, revision, alignment ("a": a clock-aligned window's own
// state) and algorithm, as redisstore's keys name them; "" for one
// policy, whose record's own key names it.
func others(e *algorithm.Evaluation, ks []key) string {
	if len(ks) < 2 {
		return ""
	}
	names := make([]string, len(ks))
	for i := 1; i < len(ks); i++ {
		b := append([]byte(ks[i].policy), ':')
		b = strconv.AppendInt(b, ks[i].revision, 10)
		if ks[i].aligned {
			b = append(b, 'a')
		}
		b = append(b, ':')
		names[i] = string(strconv.AppendInt(b, int64(e.Policies[i].Kind), 10))
	}
	return algorithm.Others(names)
}
