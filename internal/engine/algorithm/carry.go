package algorithm

// Key rotation: a state read under an older subject of the same caller
// (sluice.Evaluation.Previous) is carried to a policy whose own state is
// not live, and decided on as if it had been kept there. redisstore's
// carry.lua ports this file (live), with the checks of a carried state's
// stored form that Evaluate's corruption bounds make of any other state.

// Live reports whether st, a stored state of p (nil: absent), is there
// and does not yet equal absent at now: a store carries no older state
// over it, and a probe (redisstore's carry "probe") finds it.
func (p Policy) Live(st *State, now int64) bool {
	return st != nil && p.Expires(st) > now
}
