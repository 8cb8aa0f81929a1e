package algorithm

import (
	"math/rand/v2"
	"testing"
)

// TestDecideOneMatchesEvaluate: on every state a random sequence leaves
// (spends, peeks, refunds, the clock stepping back, other numbers under
// the same state), DecideOne answers a spend or a peek exactly as
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
					op, cost := OpSpend, 1+r.Int64N(m.p.MaxCost)
					if r.IntN(4) == 0 {
						op, cost = OpPeek, 0
					}
					ev := Evaluation{Policies: []Policy{m.p}, States: []*State{m.st}, Now: now, Op: op, Cost: cost, MaxRegression: -1,
						Decisions: make([]Decision, 1), Writes: make([]Write, 1)}
					if err := Evaluate(&ev); err != nil {
						t.Fatal(err)
					}
					var w Write
					var d Decision
					commit, err := DecideOne(&m.p, m.st, now, -1, op, cost, &w, &d)
					if err != nil {
						t.Fatal(err)
					}
					if d != ev.Decisions[0] || commit != ev.Commit || commit && w != ev.Writes[0] {
						t.Fatalf("step %d: %v cost %d at %d on %+v: DecideOne = %+v, %+v, commit %v; Evaluate = %+v, %+v, commit %v",
							step, op, cost, now, m.st, d, w, commit, ev.Decisions[0], ev.Writes[0], ev.Commit)
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
