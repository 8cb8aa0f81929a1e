package memstore

import "github.com/sluicehq/sluice/internal/engine/algorithm"

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
