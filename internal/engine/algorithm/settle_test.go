package algorithm

import (
	"errors"
	"testing"
)

// settleRun is one policy's state, decided on by Evaluate and
// EvaluateSettle as a store would: each write applied when it commits.
type settleRun struct {
	p       Policy
	st      State
	records map[string]Record
}

func newSettleRun(k Kind, p Params) *settleRun {
	return &settleRun{p: Policy{Kind: k, Params: p, ID: "p", MaxCost: p.Capacity(k)}, records: map[string]Record{}}
}

// eval takes op with cost at now for evaluation id id, and returns the
// decision, the settled values (a settle's) and the error.
func (r *settleRun) eval(t *testing.T, op Op, id string, now, cost int64) (Decision, Settled, error) {
	t.Helper()
	ps := []Policy{r.p}
	if err := Check(op, ps, cost, 0, "", id != ""); err != nil {
		return Decision{}, Settled{}, err
	}
	ev := Evaluation{Policies: ps, States: []*State{&r.st}, Now: now, Op: op, Cost: cost, MaxRegression: -1,
		Decisions: make([]Decision, 1), Writes: make([]Write, 1)}
	rid := RecordID(id, op)
	if rec, ok := r.records[rid]; ok {
		ev.Replay, ev.ReplayExtra = rec.Decisions, rec.Extra
	}
	if rec, ok := r.records[RecordID(id, OpEstimate)]; ok && op == OpSettle {
		ev.Estimate = &rec
	}
	var err error
	if op == OpSettle {
		err = EvaluateSettle(&ev)
	} else {
		err = Evaluate(&ev)
	}
	if err != nil {
		return Decision{}, Settled{}, err
	}
	if !ev.Replayed && rid != "" {
		extra := ev.Extra
		if op == OpEstimate {
			extra = EstimateExtra(cost, now)
		}
		r.records[rid] = Record{Decisions: append([]Decision(nil), ev.Decisions...), Extra: append([]int64(nil), extra...)}
	}
	if ev.Commit {
		r.st.Apply(&ev.Writes[0])
	}
	var s Settled
	if len(ev.Extra) == 3 {
		s = Settled{Charged: ev.Extra[0], GivenBack: ev.Extra[1], Owed: ev.Extra[2]}
	}
	return ev.Decisions[0], s, nil
}

// TestSettle: an estimate of 4 on "10 per minute" settled at 1 gives 3
// back, settled at 13 charges 9 past the limit (3 owed), settled at 4
// changes nothing; on every algorithm that takes estimates, with a retry
// answering the same.
func TestSettle(t *testing.T) {
	p := Params{Limit: 10, Window: 60 * sec, Burst: 10}
	for _, k := range []Kind{KindFixedWindow, KindFixedWindowEnd, KindSlidingLog, KindTokenBucket, KindGCRA} {
		for _, tc := range []struct {
			name   string
			actual int64
			want   Settled
			left   int64
		}{
			{"less", 1, Settled{GivenBack: 3}, 9},
			{"same", 4, Settled{}, 6},
			{"more", 13, Settled{Charged: 9, Owed: 3}, 0},
			{"none", 0, Settled{GivenBack: 4}, 10},
			{"far more", 1000, Settled{Charged: 16, Owed: 10}, 0},
		} {
			r := newSettleRun(k, p)
			if d, _, err := r.eval(t, OpEstimate, "x", t0, 4); err != nil || !d.Allowed || d.Remaining != 6 {
				t.Fatalf("%v %s: estimate 4 = %+v, %v; want allowed, 6 left", k, tc.name, d, err)
			}
			d, s, err := r.eval(t, OpSettle, "x", t0+sec, tc.actual)
			if err != nil || s != tc.want || d.Remaining != tc.left || !d.Allowed {
				t.Fatalf("%v %s: settle(%d) = %+v %+v, %v; want allowed, %d left, %+v", k, tc.name, tc.actual, d, s, err, tc.left, tc.want)
			}
			d2, s2, err := r.eval(t, OpSettle, "x", t0+2*sec, 7)
			if err != nil || s2 != s || d2 != d {
				t.Fatalf("%v %s: retried settle = %+v %+v, %v; want the first answer %+v %+v", k, tc.name, d2, s2, err, d, s)
			}
		}
	}
}

// TestSettleDebt: a bucket carries a settle's debt into the time after
// (nothing admitted until the rate pays it off); a fixed window closed
// since the estimate takes nothing back and counts the excess in the
// window open now; a log with spends after the estimate gives nothing
// back.
func TestSettleDebt(t *testing.T) {
	p := Params{Limit: 10, Window: 10 * sec, Burst: 10} // a unit per second
	for _, k := range []Kind{KindTokenBucket, KindGCRA} {
		r := newSettleRun(k, p)
		r.eval(t, OpEstimate, "x", t0, 10)
		if _, s, _ := r.eval(t, OpSettle, "x", t0, 15); s != (Settled{Charged: 5, Owed: 5}) {
			t.Fatalf("%v: settle 10 → 15 on an empty bucket = %+v, want 5 charged, 5 owed", k, s)
		}
		if d, _, _ := r.eval(t, OpSpend, "", t0+5*sec, 1); d.Allowed || d.Remaining != 0 {
			t.Fatalf("%v: a spend 5s later, the debt just paid = %+v, want denied", k, d)
		}
		if d, _, _ := r.eval(t, OpSpend, "", t0+6*sec, 1); !d.Allowed {
			t.Fatalf("%v: a spend 6s later = %+v, want allowed", k, d)
		}
	}
	r := newSettleRun(KindFixedWindow, p)
	r.eval(t, OpEstimate, "x", t0, 8)
	if d, s, _ := r.eval(t, OpSettle, "x", t0+11*sec, 2); s != (Settled{}) || d.Remaining != 10 {
		t.Fatalf("fixed_window: settle 8 → 2 after the window closed = %+v %+v, want nothing given back", d, s)
	}
	r.eval(t, OpEstimate, "y", t0+12*sec, 2)
	if d, s, _ := r.eval(t, OpSettle, "y", t0+30*sec, 14); s != (Settled{Charged: 12, Owed: 2}) || d.Remaining != 0 {
		t.Fatalf("fixed_window: settle 2 → 14 after the window closed = %+v %+v, want 12 charged in the window open now", d, s)
	}
	l := newSettleRun(KindSlidingLog, p)
	l.eval(t, OpEstimate, "x", t0, 5)
	l.eval(t, OpSpend, "", t0+sec, 1)
	if _, s, _ := l.eval(t, OpSettle, "x", t0+2*sec, 1); s != (Settled{}) {
		t.Fatalf("sliding_log: settle 5 → 1 after a later spend = %+v, want nothing given back", s)
	}
}

// TestSettleRefused: what Check refuses, and a settle with no estimate.
func TestSettleRefused(t *testing.T) {
	p := Params{Limit: 10, Window: 10 * sec, Burst: 10}
	for _, tc := range []struct {
		name string
		k    Kind
		op   Op
		id   string
		cost int64
		want error
	}{
		{"sliding_window", KindSlidingWindow, OpEstimate, "x", 1, ErrNotRefundable},
		{"concurrency", KindConcurrency, OpEstimate, "x", 1, ErrInvalidRequest},
		{"no id", KindGCRA, OpEstimate, "", 1, ErrInvalidRequest},
		{"estimate of 0", KindGCRA, OpEstimate, "x", 0, ErrInvalidRequest},
		{"settle below 0", KindGCRA, OpSettle, "x", -1, ErrInvalidRequest},
		{"estimate above max", KindGCRA, OpEstimate, "x", 11, ErrCostTooHigh},
		{"no estimate", KindTokenBucket, OpSettle, "x", 3, ErrInvalidRequest},
	} {
		r := newSettleRun(tc.k, p)
		if _, _, err := r.eval(t, tc.op, tc.id, t0, tc.cost); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v(cost=%d) = %v, want %v", tc.name, tc.op, tc.cost, err, tc.want)
		}
	}
	big := Params{Limit: 1, Window: MaxWindow, Burst: 100_000}
	if err := Check(OpEstimate, []Policy{{Kind: KindGCRA, Params: big, ID: "p", MaxCost: 1}}, 1, 0, "", true); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("estimate on a gcra whose doubled burst × window passes 2^53 = %v, want ErrInvalidRequest", err)
	}
	r := newSettleRun(KindFixedWindow, Params{Limit: 2, Window: sec, Burst: 2})
	r.eval(t, OpEstimate, "x", t0, 2)
	r.eval(t, OpEstimate, "y", t0, 1) // denied
	if _, _, err := r.eval(t, OpSettle, "y", t0, 1); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("settle of a denied estimate = %v, want ErrInvalidRequest", err)
	}
}

// TestDedupeExtra: a record's Extra is kept beside it, apart from the
// records that have none, and forgotten with it.
func TestDedupeExtra(t *testing.T) {
	var l DedupeLog
	ds := []Decision{{Allowed: true, Limit: 1}}
	l.Remember("s:plain", 0, 10, 5, ds)
	l.RememberRecord("e:x", 0, 10, 5, ds, []int64{3, 1}, "")
	if r, ok := l.LookupRecord("e:x", 5); !ok || len(r.Extra) != 2 || r.Extra[0] != 3 {
		t.Fatalf("LookupRecord(e:x) = %+v, %v; want its Extra [3 1]", r, ok)
	}
	if r, ok := l.LookupRecord("s:plain", 5); !ok || r.Extra != nil {
		t.Fatalf("LookupRecord(s:plain) = %+v, %v; want no Extra", r, ok)
	}
	if l.Prune(10, 5); len(l.extras) != 0 || l.Len() != 0 {
		t.Fatalf("after both expired: %d records, extras %v; want none", l.Len(), l.extras)
	}
}

// TestSettlePeriod: on calendar periods of unequal lengths (10s, then
// 5s, then 20s), a settle gives back only into the period its estimate
// was spent in while that period is open, and counts the excess in the
// period open at the settle, as a fixed window does; a retry answers the
// same.
func TestSettlePeriod(t *testing.T) {
	b := [4]int64{t0 - 10*sec, t0, t0 + 5*sec, t0 + 25*sec}
	r := &settleRun{p: periodPolicy(10, b), records: map[string]Record{}}
	for _, tc := range []struct {
		name       string
		op         Op
		id         string
		at, cost   int64
		want       Settled
		left       int64
		resetAfter int64
	}{
		{"estimate 4 in the period [t0, t0+5s)", OpEstimate, "a", t0 + sec, 4, Settled{}, 6, 4 * sec},
		{"settle at 1: 3 given back, same period", OpSettle, "a", t0 + 2*sec, 1, Settled{GivenBack: 3}, 9, 3 * sec},
		{"the settle retried", OpSettle, "a", t0 + 3*sec, 9, Settled{GivenBack: 3}, 9, 3 * sec},
		{"estimate 8", OpEstimate, "b", t0 + 4*sec, 8, Settled{}, 1, sec},
		{"settle at 12: 4 charged past the limit", OpSettle, "b", t0 + 4*sec, 12, Settled{Charged: 4, Owed: 3}, 0, sec},
		{"estimate 6 just before the period ends", OpEstimate, "c", t0 + 5*sec - 1, 6, Settled{}, 0, 1},
		{"estimate 6 in the next period", OpEstimate, "d", t0 + 5*sec, 6, Settled{}, 4, 20 * sec},
		{"estimate 2", OpEstimate, "e", t0 + 6*sec, 2, Settled{}, 2, 19 * sec},
		{"settle e at 0: given back, its period is open", OpSettle, "e", t0 + 7*sec, 0, Settled{GivenBack: 2}, 4, 18 * sec},
	} {
		d, s, err := r.eval(t, tc.op, tc.id, tc.at, tc.cost)
		if tc.name == "estimate 6 just before the period ends" {
			// Denied: 13 counted of 10, until the period's end 1µs later.
			if err != nil || d.Allowed || d.RetryAfter != 1 {
				t.Fatalf("%s = %+v, %v; want denied until the period's end", tc.name, d, err)
			}
			continue
		}
		if err != nil || !d.Allowed || s != tc.want || d.Remaining != tc.left || d.ResetAfter != tc.resetAfter {
			t.Fatalf("%s = %+v %+v, %v; want allowed, %d left, reset after %d, %+v", tc.name, d, s, err, tc.left, tc.resetAfter, tc.want)
		}
	}
	// An estimate of the period before, settled in this one: nothing
	// back (its period took its budget), the excess counted now.
	r2 := &settleRun{p: periodPolicy(10, b), records: map[string]Record{}}
	r2.eval(t, OpEstimate, "g", t0+4*sec, 5)
	if d, s, _ := r2.eval(t, OpSettle, "g", t0+6*sec, 1); s != (Settled{}) || d.Remaining != 10 {
		t.Fatalf("settle 5 → 1 after its period ended = %+v %+v, want nothing given back, 10 left", d, s)
	}
	r2.eval(t, OpEstimate, "h", t0+4*sec+1, 1) // a clock behind: still in the period before
	if d, s, _ := r2.eval(t, OpSettle, "h", t0+7*sec, 13); s != (Settled{Charged: 12, Owed: 2}) || d.Remaining != 0 || d.ResetAfter != 18*sec {
		t.Fatalf("settle 1 → 13 after its period ended = %+v %+v, want 12 charged in the period open now", d, s)
	}
}
