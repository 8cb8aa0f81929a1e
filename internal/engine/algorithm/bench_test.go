package algorithm

import "testing"

// BenchmarkEvaluate measures the engine alone deciding one allowed spend
// of one policy on an existing state, per algorithm: the part of a
// memstore decision that is the math.
func BenchmarkEvaluate(b *testing.B) {
	for _, k := range kinds {
		if k == KindConcurrency {
			continue
		}
		b.Run(k.String(), func(b *testing.B) {
			p := Params{Limit: 1_000_000_000, Window: sec, Burst: 1_000_000_000}
			if k == KindSlidingLog {
				p = Params{Limit: 100_000, Window: sec, Burst: 100_000}
			}
			var st State
			ev := &Evaluation{
				Policies:      []Policy{{Kind: k, Params: p}},
				States:        []*State{&st},
				MaxRegression: -1,
				Cost:          1,
				Decisions:     make([]Decision, 1),
				Writes:        make([]Write, 1),
			}
			now := t0
			b.ReportAllocs()
			for b.Loop() {
				now += 10
				ev.Now = now
				if err := Evaluate(ev); err != nil || !ev.Commit {
					b.Fatalf("Evaluate = %v, commit %v", err, ev.Commit)
				}
				st.Apply(&ev.Writes[0])
			}
		})
	}
}

// BenchmarkDecideOne is BenchmarkEvaluate by DecideOne, the path
// memstore takes for the common decision (a spend of one policy), on the
// numbers of bench's in-process rows (1 000 000 per second).
func BenchmarkDecideOne(b *testing.B) {
	for _, k := range kinds {
		if k == KindConcurrency {
			continue
		}
		b.Run(k.String(), func(b *testing.B) {
			p := Policy{Kind: k, Params: Params{Limit: 1_000_000, Window: sec, Burst: 1_000_000}, MaxCost: 1_000_000}
			if k == KindSlidingLog {
				p.Params = Params{Limit: 100_000, Window: sec, Burst: 100_000}
			}
			var st State
			var w Write
			var d Decision
			now := t0
			b.ReportAllocs()
			for b.Loop() {
				now += 10
				commit, err := DecideOne(&p, &st, now, -1, OpSpend, 1, 0, "", &w, &d)
				if err != nil || !commit {
					b.Fatalf("DecideOne = %v, commit %v", err, commit)
				}
				st.Apply(&w)
			}
		})
	}
}
