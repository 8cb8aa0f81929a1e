package algorithm

import (
	"errors"
	"strings"
	"testing"
)

// periodPolicy is a KindFixedPeriod policy of limit on the periods of b.
func periodPolicy(limit int64, b [4]int64) Policy {
	return Policy{Kind: KindFixedPeriod, Params: Params{Limit: limit, Window: b[2] - b[1], Burst: limit, Bounds: b}, ID: "p", MaxCost: limit}
}

// decidePeriod runs one spend (a peek for cost 0) of p on st at now, as a
// store does, and applies an admitted write.
func decidePeriod(t *testing.T, p *Policy, st *State, now, cost int64) (Decision, error) {
	t.Helper()
	var w Write
	var d Decision
	op := OpSpend
	if cost == 0 {
		op = OpPeek
	}
	commit, err := DecideOne(p, st, now, -1, op, cost, 0, "", &w, &d)
	if commit {
		if w.Expires <= now {
			*st = State{}
		} else {
			st.Apply(&w)
		}
	}
	return d, err
}

// TestFixedPeriodSteps: periods of unequal lengths (100, 50, 200µs after a
// first of 30), the window picked by the time decided at, reset to the
// period's end, a refund within the period, and the next period fresh.
func TestFixedPeriodSteps(t *testing.T) {
	b := [4]int64{1000, 1030, 1130, 1180}
	p := periodPolicy(3, b)
	var st State
	for _, c := range []struct {
		name string
		now  int64
		cost int64
		want Decision
	}{
		{"first in the middle period", 1050, 2, Decision{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 80}},
		{"the last unit", 1129, 1, Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 1}},
		{"denied until its end", 1129, 1, Decision{Limit: 3, ResetAfter: 1, RetryAfter: 1}},
		{"the next period, 50µs long", 1130, 3, Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 50}},
		{"peek at its last µs", 1179, 0, Decision{Limit: 3, ResetAfter: 1, RetryAfter: 1}},
	} {
		d, err := decidePeriod(t, &p, &st, c.now, c.cost)
		if err != nil || d != c.want {
			t.Fatalf("%s: DecideOne(now=%d, cost=%d) = %+v, %v; want %+v", c.name, c.now, c.cost, d, err, c.want)
		}
	}
	if got := p.Expires(&st); got != 1180 {
		t.Errorf("Expires = %d, want the period's end, 1180", got)
	}
	s, d := fixedPeriodOf(&st.V).Refund(p.Params, 1150, 2)
	if s.Count != 1 || !d.Allowed || d.Remaining != 2 || d.ResetAfter != 30 {
		t.Errorf("Refund(2) at 1150 = %+v, %+v; want 1 left counted, 2 remaining, reset in 30", s, d)
	}
}

// TestFixedPeriodOutside: a decision at a time outside the periods the
// caller computed is a *ClockError naming them, for a live state as for
// an absent one, and nothing is decided; the bounds' own edges are inside
// at the start and outside at the end.
func TestFixedPeriodOutside(t *testing.T) {
	b := [4]int64{1000, 1030, 1130, 1180}
	p := periodPolicy(3, b)
	var st State
	for _, now := range []int64{999, 1180, 5000} {
		_, err := decidePeriod(t, &p, &st, now, 1)
		var ce *ClockError
		if !errors.As(err, &ce) || ce.From != 1000 || ce.To != 1180 || ce.At != now || !strings.Contains(err.Error(), "outside the periods") {
			t.Errorf("DecideOne at %d on bounds %v = %v, want a *ClockError outside [1000, 1180)", now, b, err)
		}
	}
	if d, err := decidePeriod(t, &p, &st, 1000, 1); err != nil || !d.Allowed || d.ResetAfter != 30 {
		t.Errorf("DecideOne at the first bound = %+v, %v; want admitted, reset in 30", d, err)
	}
	// The state was written at 1000; the caller's clock steps back before
	// the bounds: the clock rule decides at the write's time, inside.
	if d, err := decidePeriod(t, &p, &st, 900, 1); err != nil || !d.Allowed || d.ResetAfter != 130 {
		t.Errorf("DecideOne at 900 after a write at 1000 = %+v, %v; want admitted at 1000, reset 130 after 900", d, err)
	}
}

// TestFixedPeriodJumpBackwards: a clock stepping back within the periods
// never resets a period's count (x/time/rate's TestLimiterJumpBackwards).
func TestFixedPeriodJumpBackwards(t *testing.T) {
	p := periodPolicy(2, [4]int64{1000, 2000, 3000, 4000})
	var st State
	for i, now := range []int64{2500, 2100, 2999} {
		d, err := decidePeriod(t, &p, &st, now, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; d.Allowed != want {
			t.Fatalf("spend %d at %d: allowed %t, want %t (the count survives the step back)", i, now, d.Allowed, want)
		}
	}
}

// TestFixedPeriodBounds: the corruption bound and the bounds' checks at
// their edges: a newest write up to 367 days before the period's end is a
// state, a µs more is not; bounds of 367-day periods below 2^53 are
// periods, one more µs or a bound at 2^53 is not.
func TestFixedPeriodBounds(t *testing.T) {
	for _, c := range []struct {
		s    FixedPeriod
		want string
	}{
		{FixedPeriod{End: 1 + MaxPeriod, Count: 1, Last: 1}, ""},
		{FixedPeriod{End: 2 + MaxPeriod, Count: 1, Last: 1}, "want 0 < last < end <= last + 367 days"},
		{FixedPeriod{End: 5, Count: 1, Last: 5}, "want 0 < last < end"},
		{FixedPeriod{End: 5, Count: MaxLimit + 1, Last: 4}, "count"},
	} {
		if got := c.s.corrupt(); c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%+v.corrupt() = %q, want %q", c.s, got, c.want)
		}
	}
	top := MaxExact - 1
	ok := [4]int64{top - 3*MaxPeriod, top - 2*MaxPeriod, top - MaxPeriod, top}
	for _, c := range []struct {
		b    [4]int64
		want string
	}{
		{ok, ""},
		{[4]int64{ok[0], ok[1], ok[2], top + 1}, "below 2^53"},
		{[4]int64{ok[0] - 1, ok[1], ok[2], ok[3]}, "367 days"},
		{[4]int64{0, 1, 2, 3}, "after the epoch"},
		{[4]int64{1, 2, 2, 3}, "after the one before"},
	} {
		p := Params{Limit: 1, Burst: 1, Window: c.b[2] - c.b[1], Bounds: c.b}
		err := p.Check(KindFixedPeriod)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Check(bounds %v) = %v, want %q", c.b, err, c.want)
		}
	}
	p := Params{Limit: 1, Burst: 1, Window: 7, Bounds: ok}
	if err := p.Check(KindFixedPeriod); err == nil {
		t.Errorf("Check with a window other than the middle period's = nil, want an error")
	}
	if err := (Params{Limit: 1, Burst: 1, Window: MaxWindow}).Check(KindFixedWindow); err != nil {
		t.Errorf("a window of 365 days: Check = %v, want nil", err)
	}
	if err := (Params{Limit: 1, Burst: 1, Window: MaxWindow + 1}).Check(KindFixedWindow); err == nil {
		t.Errorf("a window of 365 days and 1µs: Check = nil, want the bound")
	}
}

// TestFixedPeriodTakesNoHold: local quota's held spend is refused on a
// period, before any state is read.
func TestFixedPeriodTakesNoHold(t *testing.T) {
	p := periodPolicy(10, [4]int64{1000, 2000, 3000, 4000})
	if err := Check(OpHold, []Policy{p}, 1, 100, "", false); err == nil || !strings.Contains(err.Error(), "calendar period") {
		t.Errorf("Check(hold) on a period = %v, want refused naming the calendar period", err)
	}
}
