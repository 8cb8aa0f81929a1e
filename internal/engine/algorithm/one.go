package algorithm

// DecideOne is Evaluate for the common decision: one policy, a spend, a
// held spend (OpHold, for hold µs) or a peek that passed Check, nothing to
// replay. It runs the same steps on the
// same functions (current, then the policy's step, then lengthen), without
// the slices of an Evaluation: the decision goes to d, the state after it
// to w (Fresh included), and commit reports whether the store must apply w
// (the spend was admitted). st is the stored state, nil when absent; it is
// read, never modified.
func DecideOne(p *Policy, st *State, now, maxRegression int64, op Op, cost, hold int64, w *Write, d *Decision) (commit bool, err error) {
	if why := p.corrupt(st, now); why != "" {
		return false, &CorruptError{Reason: why}
	}
	cur, at, cerr := current(*p, st, now, maxRegression)
	if cerr != nil {
		return false, cerr
	}
	p.step(cur, at, op, cost, hold, "", w, d)
	w.Fresh = cur != st
	if at != now {
		lengthen(d, at-now)
	}
	return d.Allowed && op != OpPeek, nil
}
