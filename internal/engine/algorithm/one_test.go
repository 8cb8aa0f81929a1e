package algorithm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestDecideOneMatchesEvaluate: on every state a random sequence leaves
// (spends, peeks, refunds, the clock stepping back, other numbers under
// the same state), DecideOne answers a spend (held or not) or a peek exactly as
// Evaluate does for one policy: the same decision, the same write, the
// same commit.
func TestDecideOneMatchesEvaluate(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			for range 100 {
				p := Params{Limit: 1 + r.Int64N(50), Window: 1000 + r.Int64N(10*sec)}
				p.Burst = p.Limit
				if k == KindTokenBucket || k == KindGCRA {
					p.Burst = 1 + r.Int64N(100)
				}
				m := newMachine(k, p)
				now := t0
				for step := range 100 {
					if r.IntN(3) == 0 {
						now -= r.Int64N(p.Window)
					} else {
						now += r.Int64N(p.Window / 2)
					}
					if r.IntN(10) == 0 {
						// Other numbers under the same state.
						q := Params{Limit: 1 + r.Int64N(50), Window: 1000 + r.Int64N(10*sec)}
						q.Burst = q.Limit
						if k == KindTokenBucket || k == KindGCRA {
							q.Burst = 1 + r.Int64N(100)
						}
						m.p = Policy{Kind: k, Params: q, MaxCost: q.Capacity(k)}
					}
					op, cost, hold := OpSpend, 1+r.Int64N(m.p.MaxCost), int64(0)
					switch r.IntN(4) {
					case 0:
						op, cost = OpPeek, 0
					case 1:
						if hold = randomHold(r, m.p); hold > 0 {
							op = OpHold
						}
					}
					if err := Check(op, []Policy{m.p}, cost, hold, "", false); err != nil {
						t.Fatal(err)
					}
					ev := Evaluation{Policies: []Policy{m.p}, States: []*State{m.st}, Now: now, Op: op, Cost: cost, Hold: hold, MaxRegression: -1,
						Decisions: make([]Decision, 1), Writes: make([]Write, 1)}
					if err := Evaluate(&ev); err != nil {
						t.Fatal(err)
					}
					var w Write
					var d Decision
					commit, err := DecideOne(&m.p, m.st, now, -1, op, cost, hold, "", &w, &d)
					if err != nil {
						t.Fatal(err)
					}
					if d != ev.Decisions[0] || commit != ev.Commit || commit && w != ev.Writes[0] {
						t.Fatalf("step %d: %v cost %d hold %d at %d on %+v: DecideOne = %+v, %+v, commit %v; Evaluate = %+v, %+v, commit %v",
							step, op, cost, hold, now, m.st, d, w, commit, ev.Decisions[0], ev.Writes[0], ev.Commit)
					}
					// Move on: a refund now and then, else this decision.
					if r.IntN(6) == 0 && k != KindSlidingWindow {
						m.refund(now, 1+r.Int64N(m.p.MaxCost))
					} else if ev.Commit {
						if m.st == nil {
							m.st = new(State)
						}
						m.st.Apply(&ev.Writes[0])
					}
				}
			}
		})
	}
}

// TestDecideGCRAMatchesGeneral: decideGCRA, the course DecideOne takes
// for a GCRA policy, answers exactly as DecideOne's general course does
// (the one short.lua ports), over random numbers from the smallest to the
// largest Check allows, reserves, states left by random sequences under
// other numbers, raw states (corrupt ones among them), clocks before and
// after the state's write and regression bounds: the same commit, error,
// decision and write, every field.
func TestDecideGCRAMatchesGeneral(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 1))
	// logIn draws from [lo, hi], log-uniformly, with the ends often.
	logIn := func(lo, hi int64) int64 {
		switch r.IntN(8) {
		case 0:
			return lo
		case 1:
			return hi
		}
		v := float64(lo) * math.Pow(float64(hi)/float64(lo), r.Float64())
		return min(max(int64(v), lo), hi)
	}
	params := func() Params {
		for {
			p := Params{Limit: logIn(1, MaxLimit), Window: logIn(MinWindow, MaxWindow)}
			most := min(MaxLimit, (MaxExact-1-p.Limit)/p.Window)
			if most < 1 {
				continue
			}
			p.Burst = logIn(1, most)
			if r.IntN(3) == 0 {
				p.Reserve = int32(r.Int64N(p.Burst + 1)) // Burst itself: DecideOne's general course
			}
			return p
		}
	}
	compared := 0
	for range 20_000 {
		p := Policy{Kind: KindGCRA, Params: params()}
		p.MaxCost = p.Params.Burst
		var st *State
		switch r.IntN(4) {
		case 0: // absent
		case 1: // raw: often corrupt
			st = &State{V: [5]int64{t0 + r.Int64N(2*sec) - sec, r.Int64N(2 * p.Params.Limit), logIn(1, MaxLimit), logIn(MinWindow, MaxWindow), t0 - r.Int64N(sec)}}
			if r.IntN(10) == 0 {
				st.V[r.IntN(5)] = -st.V[r.IntN(5)]
			}
		default: // left by decisions under other numbers
			q := Policy{Kind: KindGCRA, Params: params()}
			q.Params.Reserve, q.MaxCost = 0, q.Params.Burst
			st = new(State)
			at := t0
			for range 1 + r.IntN(4) {
				at += logIn(1, q.Params.Window) - 1
				var w Write
				var d Decision
				if commit, err := decideOne(&q, st, at, -1, OpSpend, logIn(1, q.Params.Burst), 0, "", &w, &d); err != nil {
					t.Fatal(err)
				} else if commit {
					st.Apply(&w)
				}
			}
		}
		now := t0
		if st != nil {
			now = st.V[4]
		}
		switch r.IntN(3) {
		case 0:
			now -= logIn(1, 2*p.Params.Window)
		case 1:
			now += logIn(1, 2*p.Params.Window)
		}
		maxRegression := int64(-1)
		if r.IntN(2) == 0 {
			maxRegression = logIn(1, sec) - 1
		}
		op, cost, hold := OpSpend, logIn(1, p.MaxCost), int64(0)
		switch r.IntN(4) {
		case 0:
			op, cost = OpPeek, 0
		case 1:
			if hold = randomHold(r, p); hold > 0 {
				op = OpHold
			}
		}
		if Check(op, []Policy{p}, cost, hold, "", false) != nil {
			continue
		}
		var w1, w2 Write
		var d1, d2 Decision
		w1.V[2], w2.V[2] = 7, 9 // what a write left before: overwritten
		c1, err1 := DecideOne(&p, st, now, maxRegression, op, cost, hold, "", &w1, &d1)
		c2, err2 := decideOne(&p, st, now, maxRegression, op, cost, hold, "", &w2, &d2)
		if c1 != c2 || fmt.Sprint(err1) != fmt.Sprint(err2) || d1 != d2 || err1 == nil && w1 != w2 {
			t.Fatalf("%+v, %v cost %d hold %d at %d (max regression %d) on %+v:\nfast    %v %v %+v %+v\ngeneral %v %v %+v %+v",
				p, op, cost, hold, now, maxRegression, st, c1, err1, d1, w1, c2, err2, d2, w2)
		}
		compared++
	}
	if compared < 10_000 {
		t.Fatalf("only %d of 20 000 draws passed Check", compared)
	}
}

// TestBeyond: beyond(a, l, x) is a > ⌊x/l⌋, over the edges (products
// just below, at and above x; both at their largest) and random values.
func TestBeyond(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 2))
	check := func(a, l, x int64) {
		if got, want := beyond(a, l, x), a > x/l; got != want {
			t.Fatalf("beyond(%d, %d, %d) = %v, want %v", a, l, x, got, want)
		}
	}
	for _, l := range []int64{1, 2, 3, 7, 1_000_000, MaxLimit} {
		for _, x := range []int64{0, 1, l - 1, l, l + 1, MaxExact - 1, math.MaxInt64} {
			q := x / l
			for _, a := range []int64{0, 1, q - 1, q, q + 1, q + 2, MaxExact, math.MaxInt64} {
				if a >= 0 {
					check(a, l, x)
				}
			}
		}
	}
	for range 1_000_000 {
		l := 1 + r.Int64N(MaxLimit)
		x := r.Int64N(MaxExact)
		a := x/l + r.Int64N(5) - 2
		if r.IntN(4) == 0 {
			a = r.Int64()
		}
		if a >= 0 {
			check(a, l, x)
		}
	}
}
