package algorithm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestClockRegressionNeverEarly: a request whose time lies behind the
// newest write gets waits measured from its own time: retrying RetryAfter
// later is admitted, 1µs earlier is not, for every algorithm.
func TestClockRegressionNeverEarly(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			p := Params{Limit: 1, Window: sec, Burst: 1}
			for _, lag := range []int64{1, 500_000, 999_999} {
				m := newMachine(k, p)
				if d := m.decide(t0, 1); !d.Allowed {
					t.Fatalf("first spend = %+v, want allowed", d)
				}
				now := t0 - lag
				d := m.decide(now, 1)
				if d.Allowed {
					t.Fatalf("lag %d: Decide = %+v, want denied", lag, d)
				}
				if early := m.clone().decide(now+d.RetryAfter-1, 1); early.Allowed {
					t.Fatalf("lag %d: RetryAfter %d from t0-%d: admitted 1µs before it", lag, d.RetryAfter, lag)
				}
				if onTime := m.clone().decide(now+d.RetryAfter, 1); !onTime.Allowed {
					t.Fatalf("lag %d: RetryAfter %d from t0-%d: denied at it: %+v", lag, d.RetryAfter, lag, onTime)
				}
				if full := m.clone().decide(now+d.ResetAfter, 0); full.Remaining != 1 {
					t.Fatalf("lag %d: ResetAfter %d from t0-%d: %d remaining then, want 1", lag, d.ResetAfter, lag, full.Remaining)
				}
			}
		})
	}
}

// TestTokenBucketMatchesGCRA: for the same numbers the two bucket
// algorithms answer every request alike, spends, held spends, peeks and
// refunds, also when the clock steps back.
func TestTokenBucketMatchesGCRA(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		p := Params{Limit: 1 + r.Int64N(20), Window: sec * (1 + r.Int64N(10)), Burst: 1 + r.Int64N(20)}
		tb, gcra := newMachine(KindTokenBucket, p), newMachine(KindGCRA, p)
		now := t0
		for step := range 200 {
			switch r.IntN(4) {
			case 0:
				now -= r.Int64N(p.Window)
			default:
				now += r.Int64N(p.Window / 2)
			}
			cost := r.Int64N(p.Burst + 1)
			refund := cost > 0 && r.IntN(8) == 0
			var hold int64
			if cost > 0 && !refund && r.IntN(3) == 0 {
				hold = randomHold(r, tb.p)
			}
			var a, b Decision
			if hold > 0 {
				a, b = tb.held(now, cost, hold), gcra.held(now, cost, hold)
			} else {
				a, b = tb.run(now, cost, refund), gcra.run(now, cost, refund)
			}
			if a != b {
				t.Fatalf("trial %d step %d %+v: now t0%+d cost %d refund %v hold %d: token_bucket %+v, gcra %+v", trial, step, p, now-t0, cost, refund, hold, a, b)
			}
		}
	}
}

// TestEvaluateAllOrNothing: one denying policy spends nothing on any; the
// ones that would have admitted report their unspent state.
func TestEvaluateAllOrNothing(t *testing.T) {
	wide := Policy{Kind: KindFixedWindow, Params: Params{Limit: 10, Window: 10 * sec, Burst: 10}}
	narrow := Policy{Kind: KindGCRA, Params: Params{Limit: 1, Window: sec, Burst: 2}}
	states := []*State{nil, nil}
	run := func(now, cost int64) *Evaluation {
		t.Helper()
		op := OpSpend
		if cost == 0 {
			op = OpPeek
		}
		ev := &Evaluation{Policies: []Policy{wide, narrow}, States: states, Now: now, Op: op, Cost: cost, MaxRegression: -1, Decisions: make([]Decision, 2), Writes: make([]Write, 2)}
		if err := Evaluate(ev); err != nil {
			t.Fatal(err)
		}
		if ev.Commit {
			for i, w := range ev.Writes {
				if states[i] == nil {
					states[i] = new(State)
				}
				states[i].Apply(&w)
			}
		}
		return ev
	}
	if ev := run(t0, 2); !ev.Commit || ev.Decisions[0].Remaining != 8 || ev.Decisions[1].Remaining != 0 {
		t.Fatalf("spend 2 = %+v, want committed with 8 and 0 left", ev)
	}
	ev := run(t0+1, 3)
	want := []Decision{
		{Allowed: true, Limit: 10, Remaining: 8, ResetAfter: 10*sec - 1},
		{Limit: 2, RetryAfter: 3*sec - 1, ResetAfter: 2*sec - 1},
	}
	if ev.Commit || fmt.Sprint(ev.Decisions) != fmt.Sprint(want) {
		t.Fatalf("spend 3 over a full bucket = commit %v %+v, want nothing spent and %+v", ev.Commit, ev.Decisions, want)
	}
	if ev := run(t0+2, 0); ev.Commit || ev.Decisions[0].Remaining != 8 {
		t.Fatalf("peek after the denial = %+v, want 8 left on the wide policy", ev)
	}
}

// TestEvaluateReset: a reset decides every policy as absent state and
// commits writes that delete, whatever the states hold.
func TestEvaluateReset(t *testing.T) {
	p := Policy{Kind: KindSlidingLog, Params: Params{Limit: 2, Window: sec, Burst: 2}}
	q := Policy{Kind: KindGCRA, Params: Params{Limit: 1, Window: sec, Burst: 3}}
	full := &State{Log: []int64{t0, t0}}
	owing := &State{V: [5]int64{t0 + 3*sec, 0, 1, sec, t0}}
	ev := &Evaluation{Policies: []Policy{p, q}, States: []*State{full, owing}, Now: t0 + 1, Op: OpReset, MaxRegression: -1,
		Decisions: make([]Decision, 2), Writes: make([]Write, 2)}
	if err := Evaluate(ev); err != nil {
		t.Fatal(err)
	}
	want := []Decision{{Allowed: true, Limit: 2, Remaining: 2}, {Allowed: true, Limit: 3, Remaining: 3}}
	if !ev.Commit || fmt.Sprint(ev.Decisions) != fmt.Sprint(want) {
		t.Fatalf("reset = commit %v %+v, want committed %+v", ev.Commit, ev.Decisions, want)
	}
	for i, w := range ev.Writes {
		if w.Expires > ev.Now || !w.Fresh {
			t.Fatalf("reset write %d = %+v, want one that deletes", i, w)
		}
	}
}

func TestEvaluateReplay(t *testing.T) {
	p := Policy{Kind: KindFixedWindow, Params: Params{Limit: 3, Window: sec, Burst: 3}}
	first := []Decision{{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: sec}}
	ev := &Evaluation{Policies: []Policy{p}, States: []*State{nil}, Now: t0, Cost: 1, MaxRegression: -1, Replay: first, Decisions: make([]Decision, 1), Writes: make([]Write, 1)}
	if err := Evaluate(ev); err != nil || !ev.Replayed || ev.Commit || ev.Decisions[0] != first[0] {
		t.Fatalf("Evaluate with a replay = %+v, %v; want the replay, nothing committed", ev, err)
	}
	ev = &Evaluation{Policies: []Policy{p, p}, States: []*State{nil, nil}, Now: t0, Cost: 1, MaxRegression: -1, Replay: first, Decisions: make([]Decision, 2), Writes: make([]Write, 2)}
	var re *ReplayError
	if err := Evaluate(ev); !errors.As(err, &re) || re.First != 1 || re.Now != 2 {
		t.Fatalf("Evaluate with a replay of 1 policy for 2 = %v, want a *ReplayError", err)
	}
	for _, c := range []struct {
		id   string
		op   Op
		want string
	}{{"", OpSpend, ""}, {"x", OpPeek, ""}, {"x", OpSpend, "s:x"}, {"x", OpAcquire, "s:x"}, {"x", OpRefund, "r:x"}, {"x", OpReset, ""}, {"x", OpRenew, ""}} {
		if got := RecordID(c.id, c.op); got != c.want {
			t.Errorf("RecordID(%q, %v) = %q, want %q", c.id, c.op, got, c.want)
		}
	}
}

// TestEvaluateClockBound: behind the newest write by more than
// MaxRegression is a *ClockError naming the policy; within it, decided.
func TestEvaluateClockBound(t *testing.T) {
	p := Policy{Kind: KindTokenBucket, Params: Params{Limit: 5, Window: sec, Burst: 5}}
	st := new(State)
	ev := &Evaluation{Policies: []Policy{p}, States: []*State{st}, Now: t0, Cost: 1, MaxRegression: 1000, Decisions: make([]Decision, 1), Writes: make([]Write, 1)}
	if err := Evaluate(ev); err != nil {
		t.Fatal(err)
	}
	st.Apply(&ev.Writes[0])
	ev.Now = t0 - 1000
	if err := Evaluate(ev); err != nil || !ev.Decisions[0].Allowed {
		t.Fatalf("1000µs behind with a bound of 1000 = %+v, %v; want decided", ev.Decisions, err)
	}
	ev.Now = t0 - 1001
	var ce *ClockError
	if err := Evaluate(ev); !errors.As(err, &ce) || ce.Policy != 0 || ce.Behind != 1001 {
		t.Fatalf("1001µs behind with a bound of 1000 = %v, want a *ClockError", err)
	}
}

// TestWorstCaseBursts holds the worst cases the documentation states:
// fixed_window admits 2 × Limit − 1 in a half-open window-long interval,
// sliding_window 197 of 100 per second within 990ms under a pattern aimed
// at its estimate, sliding_log never more than Limit.
func TestWorstCaseBursts(t *testing.T) {
	const ms = 1000
	type req struct{ at, cost int64 }
	admitted := func(k Kind, p Params, reqs []req, from, to int64) int64 {
		m := newMachine(k, p)
		var n int64
		for _, r := range reqs {
			if d := m.decide(r.at, r.cost); d.Allowed && r.at >= from && r.at < to {
				n += r.cost
			}
		}
		return n
	}
	p := Params{Limit: 100, Window: sec, Burst: 100}
	// fixed_window: the window opens at t0 with one unit; 99 at its last
	// µs, 100 at the first µs of the next.
	fw := []req{{t0, 1}, {t0 + sec - 1, 99}, {t0 + sec, 100}}
	if n := admitted(KindFixedWindow, p, fw, t0+1, t0+1+sec); n != 199 {
		t.Errorf("fixed_window boundary burst: %d admitted in a half-open window-long interval, want 2 × 100 − 1", n)
	}
	// sliding_window: 100 over the last 10ms of a window, 100 more offered
	// 970–980ms into the next.
	var sw []req
	for i := range int64(100) {
		sw = append(sw, req{t0 + sec - 10*ms + i*100, 1})
	}
	for i := range int64(100) {
		sw = append(sw, req{t0 + 2*sec - 30*ms + i*100, 1})
	}
	if n := admitted(KindSlidingWindow, p, sw, t0+sec-10*ms, t0+2*sec-20*ms); n != 197 {
		t.Errorf("sliding_window aimed at its estimate: %d admitted within 990ms, want 197", n)
	}
	if n := admitted(KindSlidingLog, p, sw, t0+sec-10*ms, t0+2*sec-10*ms); n > 100 {
		t.Errorf("sliding_log under the same pattern: %d admitted within one window, want at most 100", n)
	}
}

// TestSlidingWindowUnderPoisson measures what sliding_window admits in a
// window-long interval under Poisson arrivals that start mid-window, at
// several offered rates (go test -v -run TestSlidingWindowUnderPoisson
// prints the figures the documentation quotes), and holds it below
// 2 × Limit, the bound of its model.
func TestSlidingWindowUnderPoisson(t *testing.T) {
	p := Params{Limit: 100, Window: sec, Burst: 100}
	for _, rate := range []float64{1, 2, 10} {
		var worst int
		for trial := range 200 {
			r := rand.New(rand.NewPCG(uint64(trial), 7))
			m := newMachine(KindSlidingWindow, p)
			now := t0 + sec/2 + r.Int64N(sec/2)
			var admitted []int64
			for range 2000 {
				now += int64(r.ExpFloat64() / (rate * float64(p.Limit)) * float64(sec))
				if d := m.decide(now, 1); d.Allowed {
					admitted = append(admitted, now)
				}
			}
			j := 0
			for i := range admitted {
				for j < len(admitted) && admitted[j]-admitted[i] < p.Window {
					j++
				}
				worst = max(worst, j-i)
			}
		}
		t.Logf("offered %v × the limit: at most %d admitted in a window-long interval (%.2f × limit, worst of 200 runs of 2000 requests)", rate, worst, float64(worst)/float64(p.Limit))
		if worst >= 2*int(p.Limit) {
			t.Errorf("offered %v × the limit: %d admitted in a window-long interval, want below 2 × %d", rate, worst, p.Limit)
		}
	}
}

// TestEvaluateRefusesCorrupt: a stored state or remembered decisions that
// no decision leaves behind are a *CorruptError, decided on never (issue
// 32, point 3): a log with older entries pushed after its newest, which
// would read as ended and admit a fresh limit, and a replay of more left
// than its limit.
func TestEvaluateRefusesCorrupt(t *testing.T) {
	const t0 = int64(1_767_225_600_000_000)
	minute := int64(60_000_000)
	log := Policy{Kind: KindSlidingLog, Params: Params{Limit: 5, Window: minute, Burst: 5}, MaxCost: 5}
	fixed := Policy{Kind: KindFixedWindow, Params: Params{Limit: 5, Window: minute, Burst: 5}, MaxCost: 5}
	for _, tc := range []struct {
		name   string
		p      Policy
		st     *State
		replay []Decision
		policy int
	}{
		{"log pushed after its newest", log, &State{Log: []int64{t0, t0 + 1, 1, 2}}, nil, 0},
		{"log ended and unsorted", log, &State{Log: []int64{t0 - 2*minute, t0 - 3*minute, t0 - 2*minute}}, nil, 0},
		{"fixed window count 0", fixed, &State{V: [5]int64{t0, 0, t0}}, nil, 0},
		{"replay of more than the limit", fixed, nil, []Decision{{Allowed: true, Limit: 5, Remaining: 999_999}}, -1},
		{"replay denied without a wait", fixed, nil, []Decision{{Limit: 5, ResetAfter: minute}}, -1},
	} {
		ev := Evaluation{Policies: []Policy{tc.p}, States: []*State{tc.st}, Now: t0 + 10, Op: OpSpend, Cost: 1, MaxRegression: -1,
			Replay: tc.replay, Decisions: make([]Decision, 1), Writes: make([]Write, 1)}
		err := Evaluate(&ev)
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Policy != tc.policy || ev.Commit || ev.Replayed {
			t.Errorf("%s: Evaluate = %v (commit %t, replayed %t), want a *CorruptError of policy %d", tc.name, err, ev.Commit, ev.Replayed, tc.policy)
		}
		if tc.replay == nil {
			w := Write{}
			var d Decision
			if _, err := DecideOne(&tc.p, tc.st, t0+10, -1, OpSpend, 1, 0, "", &w, &d); !errors.As(err, &ce) {
				t.Errorf("%s: DecideOne = %v, want a *CorruptError", tc.name, err)
			}
		}
	}
}

// TestFixedWindowEndDecidesAsFixedWindow: the state a store keeps on its
// own clock (the count and the window's end) answers every spend, peek
// and refund as the caller-clock state does, first-request and
// clock-aligned windows alike, the clock never going back.
func TestFixedWindowEndDecidesAsFixedWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 4))
	for _, aligned := range []bool{false, true} {
		for range 50 {
			p := Params{Limit: 1 + r.Int64N(20), Window: 1_000 + r.Int64N(5_000_000), Aligned: aligned}
			p.Burst = p.Limit
			a, b := newMachine(KindFixedWindow, p), newMachine(KindFixedWindowEnd, p)
			now := int64(1_767_225_600_000_000) + r.Int64N(p.Window)
			for i := range 400 {
				now += r.Int64N(p.Window / 3)
				cost := r.Int64N(4)
				var da, db Decision
				if r.IntN(8) == 0 && cost > 0 {
					da, db = a.refund(now, cost), b.refund(now, cost)
				} else {
					da, db = a.decide(now, cost), b.decide(now, cost)
				}
				if da != db {
					t.Fatalf("%+v step %d at %d cost %d: FixedWindowEnd = %+v, FixedWindow = %+v", p, i, now, cost, db, da)
				}
			}
		}
	}
}
