package algorithm

import (
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
					commit, err := DecideOne(&m.p, m.st, now, -1, op, cost, hold, &w, &d)
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
