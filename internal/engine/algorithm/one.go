package algorithm

// DecideOne is Evaluate for the common decision: one policy, a spend, a
// held spend (OpHold, for hold µs) or a peek, or an acquire or a release
// of lease, that passed Check, nothing to replay. It runs the same steps on the
// same functions (current, then the policy's step, then lengthen), without
// the slices of an Evaluation: the decision goes to d, the state after it
// to w (Fresh included), and commit reports whether the store must apply w
// (the spend was admitted). st is the stored state, nil when absent; it is
// read, never modified.
func DecideOne(p *Policy, st *State, now, maxRegression int64, op Op, cost, hold int64, lease string, w *Write, d *Decision) (commit bool, err error) {
	if p.Kind == KindGCRA && op != OpRefund && op != OpBook && p.Params.Reserve >= 0 && int64(p.Params.Reserve) < p.Params.Burst {
		return decideGCRA(p, st, now, maxRegression, op, cost, hold, w, d)
	}
	return decideOne(p, st, now, maxRegression, op, cost, hold, lease, w, d)
}

// decideOne is DecideOne's general course, every algorithm's.
func decideOne(p *Policy, st *State, now, maxRegression int64, op Op, cost, hold int64, lease string, w *Write, d *Decision) (commit bool, err error) {
	if why := p.corrupt(st, now); why != "" {
		return false, &CorruptError{Reason: why}
	}
	cur, at, cerr := current(*p, st, now, maxRegression)
	if cerr != nil {
		return false, cerr
	}
	p.step(cur, at, op, cost, hold, lease, w, d)
	w.Fresh = cur != st
	if at != now {
		lengthen(d, at-now)
	}
	return d.Allowed && op != OpPeek, nil
}

// decideGCRA is DecideOne's general course (corrupt, current, step,
// Fresh, lengthen) for a GCRA policy's spend, held spend or peek, with a
// Reserve below its Burst, written out on the state's fields: Go only, the
// course memstore takes on every such decision. short.lua ports the
// general course, function by function; this one answers exactly the
// same, TestDecideGCRAMatchesGeneral holds it to that over random states,
// numbers and clocks. What it does differently is how it computes, never
// what: it copies no Policy, Params or GCRA, reschedules a state at most
// once, and it divides twice on an admitted spend (GCRA.Decide's ⌈debt/T⌉
// is the quotient of the new TAT plus one when there is a remainder; its
// test "ahead > τ/Limit + 1" is beyond's product).
func decideGCRA(p *Policy, st *State, now, maxRegression int64, op Op, cost, hold int64, w *Write, d *Decision) (bool, error) {
	var t, f, expires int64 // the schedule decided on (under p) and when it ends; zeros: absent
	at, fresh := now, true
	if st != nil && (st.V != absent.V || len(st.Log) != 0) {
		if why := gcraOf(&st.V).corrupt(); why != "" {
			return false, &CorruptError{Reason: why}
		}
		t, f = st.V[0], st.V[1]
		if s := gcraOf(&st.V); !s.scheduledUnder(p.Params) {
			r := s.reschedule(p.Params)
			t, f = r.TAT, r.Frac
		}
		if t != 0 {
			expires = t + min(f, 1)
		}
		// current: a live state written after now is decided at its write.
		if newest := st.V[4]; expires > now && newest > now {
			if maxRegression >= 0 && newest-now > maxRegression {
				return false, &ClockError{Behind: newest - now, Max: maxRegression}
			}
			at = newest
		}
		fresh = expires <= at
	}
	if fresh {
		t, f, expires = 0, 0, 0
	}
	w.Fresh, w.Log, w.Leases = fresh, LogEdit{}, LeaseEdit{}
	// The state step leaves when it keeps the one decided on: that one, as
	// stored (absent: zeros), ending at expires.
	if fresh {
		w.V = [5]int64{}
	} else {
		w.V[0], w.V[1], w.V[2], w.V[3], w.V[4] = st.V[0], st.V[1], st.V[2], st.V[3], st.V[4]
	}
	w.Expires = expires
	gcraStep(&p.Params, t, f, at, cost, hold, w, d)
	if at != now {
		lengthen(d, at-now)
	}
	return d.Allowed && op != OpPeek, nil
}

// gcraStep is GCRA.Decide at now on the schedule t, f (under pp), for
// decideGCRA: the decision to d and, when a spend is admitted, the new
// state and its end to w (otherwise w is left as it is: the state kept).
func gcraStep(pp *Params, t, f, now, cost, hold int64, w *Write, d *Decision) {
	limit, window := pp.Limit, pp.Window
	tau := (pp.Burst - int64(pp.Reserve)) * window
	need := verdictCost(cost) * window
	d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.Delay = false, pp.Burst, 0, 0, 0, 0
	var debt int64
	if ahead := t - now; t != 0 && ahead >= 0 {
		// ahead > τ/Limit + 1, as GCRA.Decide asks it, without dividing.
		if ahead > 0 && beyond(ahead-1, limit, tau) {
			d.RetryAfter = ahead - floorDiv(tau-need-f, limit)
			d.ResetAfter = ahead + ceilDiv(f, limit)
			return
		}
		debt = ahead*limit + f
	}
	debt = max(debt, hold*limit)
	if debt > tau-need {
		d.Remaining = max(tau-debt, 0) / window
		d.RetryAfter = ceilDiv(debt-(tau-need), limit)
		d.ResetAfter = ceilDiv(debt, limit)
		return
	}
	d.Allowed = true
	if cost <= 0 { // a peek keeps the state (a negative cost, which Check refuses, too)
		d.Remaining = (tau - debt) / window
		d.ResetAfter = ceilDiv(debt, limit)
		return
	}
	debt += cost * window
	q, r := debt/limit, debt%limit
	w.V[0], w.V[1], w.V[2], w.V[3], w.V[4] = now+q, r, limit, window, now
	w.Expires = now + q + min(r, 1)
	d.Remaining = (tau - debt) / window
	d.ResetAfter = q
	if r != 0 {
		d.ResetAfter++
	}
}
