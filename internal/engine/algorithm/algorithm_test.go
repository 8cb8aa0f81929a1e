package algorithm

import (
	"fmt"
	"slices"
	"testing"
)

// machine runs one policy through Evaluate over a state it holds, the way
// a store does: the state changes only when the evaluation commits.
type machine struct {
	p  Policy
	st *State // nil = absent
}

func newMachine(k Kind, p Params) *machine {
	return &machine{p: Policy{Kind: k, Params: p, MaxCost: p.Capacity(k)}}
}

func (m *machine) decide(now, cost int64) Decision { return m.run(now, cost, false) }
func (m *machine) refund(now, n int64) Decision    { return m.run(now, n, true) }

// held spends cost held for hold µs (an OpHold that passed Check; a
// plain spend when hold is 0).
func (m *machine) held(now, cost, hold int64) Decision {
	if hold == 0 {
		return m.eval(now, OpSpend, cost, 0)
	}
	return m.eval(now, OpHold, cost, hold)
}

// spend is held for a spend of cost ≥ 1, decide for a peek (cost 0).
func (m *machine) spend(now, cost, hold int64) Decision {
	if cost == 0 {
		return m.decide(now, 0)
	}
	return m.held(now, cost, hold)
}

func (m *machine) run(now, cost int64, refund bool) Decision {
	op := OpSpend
	switch {
	case refund:
		op = OpRefund
	case cost == 0:
		op = OpPeek
	}
	return m.eval(now, op, cost, 0)
}

func (m *machine) eval(now int64, op Op, cost, hold int64) Decision {
	ev := Evaluation{Policies: []Policy{m.p}, States: []*State{m.st}, Now: now, Op: op, Cost: cost, Hold: hold, MaxRegression: -1,
		Decisions: make([]Decision, 1), Writes: make([]Write, 1)}
	if err := Evaluate(&ev); err != nil {
		panic(err)
	}
	if ev.Commit {
		if m.st == nil {
			m.st = new(State)
		}
		m.st.Apply(&ev.Writes[0])
	}
	return ev.Decisions[0]
}

func (m *machine) expires() int64 {
	if m.st == nil {
		return 0
	}
	return m.p.Expires(m.st)
}

func (m *machine) clone() *machine {
	c := *m
	if m.st != nil {
		st := *m.st
		st.Log = slices.Clone(m.st.Log)
		c.st = &st
	}
	return &c
}

// snapshot returns the state, for "unchanged" checks. A log's is its
// newest entry (trimming may drop old entries at any write, but only an
// admission adds one); a sliding window's is its expiry (re-basing to a
// later window moves Curr to Prev but keeps it, while an admission
// extends it).
func (m *machine) snapshot() string {
	switch {
	case m.st == nil:
		return "absent"
	case m.p.Kind == KindSlidingLog:
		return fmt.Sprint(SlidingLog{Entries: m.st.Log}.Newest())
	case m.p.Kind == KindSlidingWindow:
		return fmt.Sprint(m.expires())
	}
	return fmt.Sprint(m.st.V)
}

var kinds = []Kind{KindFixedWindow, KindSlidingLog, KindSlidingWindow, KindTokenBucket, KindGCRA}

// t0 is an arbitrary instant, a whole number of seconds.
const t0 int64 = 1_767_225_600_000_000

const sec = int64(1_000_000)

func TestSteps(t *testing.T) {
	type row struct {
		name      string
		at        int64 // µs after t0
		cost      int64
		allowed   bool
		remaining int64
		retry     int64
		reset     int64
	}
	cases := []struct {
		kind Kind
		p    Params
		rows []row
	}{
		{KindFixedWindow, Params{Limit: 3, Window: 10 * sec, Burst: 3}, []row{
			{"opens the window", 0, 1, true, 2, 0, 10 * sec},
			{"peek", sec, 0, true, 2, 0, 9 * sec},
			{"cost 2", 2 * sec, 2, true, 0, 0, 8 * sec},
			{"full", 3 * sec, 1, false, 0, 7 * sec, 7 * sec},
			{"next window", 10 * sec, 3, true, 0, 0, 10 * sec},
		}},
		{KindFixedWindow, Params{Limit: 3, Window: 60 * sec, Burst: 3, Aligned: true}, []row{
			// t0 is a whole minute: windows are [t0-60s, t0), [t0, t0+60s), …
			{"opens mid-minute, resets at the minute", 20 * sec, 1, true, 2, 0, 40 * sec},
			{"peek", 30 * sec, 0, true, 2, 0, 30 * sec},
			{"cost 2", 59 * sec, 2, true, 0, 0, sec},
			{"full until the minute", 59*sec + 1, 1, false, 0, sec - 1, sec - 1},
			{"the next minute opens at its boundary", 60 * sec, 1, true, 2, 0, 60 * sec},
			{"a spend 1µs before a boundary gets 1µs", 120*sec - 1, 2, true, 0, 0, 1},
			{"the boundary", 120 * sec, 3, true, 0, 0, 60 * sec},
		}},
		{KindSlidingLog, Params{Limit: 3, Window: 10 * sec, Burst: 3}, []row{
			{"a", 0, 1, true, 2, 0, 10 * sec},
			{"b", 4 * sec, 2, true, 0, 0, 10 * sec},
			{"full: the oldest leaves at 10s", 5 * sec, 1, false, 0, 5 * sec, 9 * sec},
			{"cost 2 waits for b", 5 * sec, 0, false, 0, 5 * sec, 9 * sec},
			{"a left", 10 * sec, 1, true, 0, 0, 10 * sec},
			{"two need b's both units gone", 10 * sec, 2, false, 0, 4 * sec, 10 * sec},
		}},
		{KindSlidingWindow, Params{Limit: 10, Window: 10 * sec, Burst: 10}, []row{
			{"previous window", -5 * sec, 10, true, 0, 0, 15 * sec},
			{"half elapsed: previous weighs 5", 5 * sec, 5, true, 0, 0, 15 * sec},
			{"decayed by one", 6 * sec, 1, true, 0, 0, 14 * sec},
			{"denied until the next decays", 6 * sec, 1, false, 0, 1 * sec, 14 * sec},
			{"decayed by two", 7 * sec, 1, true, 0, 0, 13 * sec},
		}},
		{KindTokenBucket, Params{Limit: 1, Window: 3 * sec, Burst: 2}, []row{
			{"full bucket", 0, 2, true, 0, 0, 6 * sec},
			{"1/3 token refilled", sec, 1, false, 0, 2 * sec, 5 * sec},
			{"one token", 3 * sec, 1, true, 0, 0, 6 * sec},
			{"cost 2 needs 6s", 3 * sec, 2, false, 0, 6 * sec, 6 * sec},
		}},
		{KindGCRA, Params{Limit: 1, Window: 3 * sec, Burst: 2}, []row{
			{"burst", 0, 2, true, 0, 0, 6 * sec},
			{"1/3 interval on", sec, 1, false, 0, 2 * sec, 5 * sec},
			{"one interval", 3 * sec, 1, true, 0, 0, 6 * sec},
			{"cost 2 needs 6s", 3 * sec, 2, false, 0, 6 * sec, 6 * sec},
		}},
	}
	for _, c := range cases {
		name := c.kind.String()
		if c.p.Aligned {
			name += "_aligned"
		}
		t.Run(name, func(t *testing.T) {
			if err := c.p.Check(c.kind); err != nil {
				t.Fatal(err)
			}
			m := newMachine(c.kind, c.p)
			for _, r := range c.rows {
				got := m.decide(t0+r.at, r.cost)
				want := Decision{Allowed: r.allowed, Limit: c.p.Capacity(c.kind), Remaining: r.remaining, RetryAfter: r.retry, ResetAfter: r.reset}
				if got != want {
					t.Fatalf("%s: Decide(t0%+dµs, cost=%d) = %+v, want %+v", r.name, r.at, r.cost, got, want)
				}
			}
		})
	}
}

// TestJumpBackwards follows x/time/rate's TestLimiterJumpBackwards: a clock
// that goes back neither resets nor corrupts state, and time lost going
// back is not counted as time passed.
func TestJumpBackwards(t *testing.T) {
	for i, k := range append(kinds, KindFixedWindow) {
		name, aligned := k.String(), i == len(kinds)
		if aligned {
			name += "_aligned"
		}
		t.Run(name, func(t *testing.T) {
			p := Params{Limit: 2, Window: 10 * sec, Burst: 2, Aligned: aligned}
			m := newMachine(k, p)
			if d := m.decide(t0+5*sec, 2); !d.Allowed {
				t.Fatalf("spend 2 = %+v, want allowed", d)
			}
			before := m.snapshot()
			for _, back := range []int64{1, sec, 3600 * sec, t0 - 1} {
				d := m.decide(t0+5*sec-back, 1)
				if d.Allowed || d.RetryAfter <= 0 || d.Remaining != 0 {
					t.Fatalf("%dµs back: Decide = %+v, want denied with a positive retry", back, d)
				}
				if got := m.snapshot(); got != before {
					t.Fatalf("%dµs back: state %s, want %s unchanged", back, got, before)
				}
			}
			d := m.decide(t0+5*sec, 1)
			if d.Allowed {
				t.Fatalf("back at the spend instant: %+v, want denied", d)
			}
			if d := m.decide(t0+5*sec+d.RetryAfter, 1); !d.Allowed {
				t.Fatalf("after the retry: %+v, want allowed", d)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	cases := []struct {
		kind  Kind
		p     Params
		field string // "" = valid
	}{
		{KindFixedWindow, Params{Limit: 1, Window: MinWindow, Burst: 1}, ""},
		{KindFixedWindow, Params{Limit: MaxLimit, Window: MaxWindow, Burst: MaxLimit}, ""},
		{KindFixedWindow, Params{Limit: 1, Window: MinWindow - 1, Burst: 1}, "window"},
		{KindFixedWindow, Params{Limit: 1, Window: MaxWindow + 1, Burst: 1}, "window"},
		{KindFixedWindow, Params{Limit: 0, Window: sec, Burst: 1}, "limit"},
		{KindFixedWindow, Params{Limit: MaxLimit + 1, Window: sec, Burst: 1}, "limit"},
		{KindTokenBucket, Params{Limit: 1, Window: sec, Burst: 0}, "burst"},
		{KindSlidingLog, Params{Limit: MaxSlidingLogLen, Window: sec, Burst: 1}, ""},
		{KindSlidingLog, Params{Limit: MaxSlidingLogLen + 1, Window: sec, Burst: 1}, "limit"},
		{KindSlidingWindow, Params{Limit: MaxLimit, Window: 9 * sec, Burst: MaxLimit}, ""},
		{KindSlidingWindow, Params{Limit: MaxLimit, Window: 10 * sec, Burst: MaxLimit}, "limit"},
		{KindGCRA, Params{Limit: MaxLimit, Window: 86_400_000_000, Burst: 104_000}, ""},
		{KindGCRA, Params{Limit: 1, Window: 86_400_000_000, Burst: 105_000}, "burst"},
		{KindGCRA, Params{Limit: MaxLimit, Window: MaxWindow, Burst: 285}, ""},
		{KindGCRA, Params{Limit: 1, Window: MaxWindow, Burst: 286}, "burst"},
		{KindConcurrency, Params{Limit: 1, Window: MaxLeaseTTL, Burst: 1}, ""},
		{KindConcurrency, Params{Limit: 1, Window: MaxLeaseTTL + 1, Burst: 1}, "window"},
		{KindTokenBucket, Params{Limit: MaxLimit, Window: sec, Burst: MaxLimit}, ""},
		{Kind(9), Params{Limit: 1, Window: sec, Burst: 1}, "algorithm"},
		{KindFixedWindow, Params{Limit: 1, Window: sec, Burst: 1, Aligned: true}, ""},
		{KindSlidingWindow, Params{Limit: 1, Window: sec, Burst: 1, Aligned: true}, "align"},
		{KindTokenBucket, Params{Limit: 1, Window: sec, Burst: 1, Aligned: true}, "align"},
	}
	for _, c := range cases {
		err := c.p.Check(c.kind)
		var field string
		if re, ok := err.(*RangeError); ok {
			field = re.Field
		} else if err != nil {
			t.Fatalf("Check(%v, %+v) = %T %v, want *RangeError", c.kind, c.p, err, err)
		}
		if field != c.field {
			t.Errorf("Check(%v, %+v) = %v, want an error on %q", c.kind, c.p, err, c.field)
		}
	}
}

// TestExtremes runs every algorithm at the edges of Check's bounds, where an
// overflow would show as a negative or oversized number.
func TestExtremes(t *testing.T) {
	for _, k := range kinds {
		for _, p := range []Params{
			{Limit: 1, Window: MaxWindow, Burst: 1},
			{Limit: MaxLimit, Window: MinWindow, Burst: MaxLimit},
			{Limit: 1, Window: MaxWindow, Burst: (MaxExact - 2) / MaxWindow},
			{Limit: 3, Window: MinWindow, Burst: 1},
		} {
			if k == KindSlidingLog {
				p.Limit, p.Burst = min(p.Limit, 1000), min(p.Burst, 1000)
			}
			if k == KindSlidingWindow {
				p.Limit = min(p.Limit, (MaxExact-1)/p.Window)
			}
			if k != KindTokenBucket && k != KindGCRA {
				p.Burst = p.Limit
			}
			if err := p.Check(k); err != nil {
				t.Fatalf("%v %+v: %v", k, p, err)
			}
			m := newMachine(k, p)
			capacity := p.Capacity(k)
			for i, now := range []int64{t0, t0, t0 + 1, t0 + p.Window - 1, t0 + 5*p.Window, t0 - MaxWindow, t0 + 10*MaxWindow} {
				d := m.decide(now, capacity)
				checkDecision(t, fmt.Sprintf("%v %+v step %d", k, p, i), d, capacity)
			}
		}
	}
}

func checkDecision(t *testing.T, what string, d Decision, capacity int64) {
	t.Helper()
	switch {
	case d.Limit != capacity:
		t.Fatalf("%s: Limit %d, want %d", what, d.Limit, capacity)
	case d.Remaining < 0 || d.Remaining > capacity:
		t.Fatalf("%s: Remaining %d outside [0, %d]", what, d.Remaining, capacity)
	case d.Allowed != (d.RetryAfter == 0):
		t.Fatalf("%s: Allowed %v with RetryAfter %d: retry must be 0 iff allowed", what, d.Allowed, d.RetryAfter)
	case d.RetryAfter < 0 || d.ResetAfter < 0:
		t.Fatalf("%s: negative wait %+v", what, d)
	}
}

// admission is one admitted request in a fuzz run.
type admission struct{ at, cost int64 }

// checkBound verifies the definition's bound over every interval that
// starts at an admission: at most bound(span) units in [at, at+span] while
// within(i, j).
func checkBound(log []admission, within func(i, j int) bool, bound func(span int64) int64) error {
	for i := range log {
		var sum int64
		for j := i; j < len(log) && within(i, j); j++ {
			sum += log[j].cost
			if span := log[j].at - log[i].at; sum > bound(span) {
				return fmt.Errorf("%d units admitted in [%d, %d] (%dµs), the definition allows %d", sum, log[i].at, log[j].at, span, bound(span))
			}
		}
	}
	return nil
}

func TestCheckBoundCatchesExcess(t *testing.T) {
	// The bound checker itself must be able to fail.
	err := checkBound([]admission{{0, 2}, {1, 2}}, func(i, j int) bool { return true }, func(int64) int64 { return 3 })
	if err == nil {
		t.Fatal("checkBound accepted 4 units against a bound of 3")
	}
}
