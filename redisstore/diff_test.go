package redisstore_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algorithm"
)

var (
	diffSteps = flag.Int("sluice.diffsteps", 10_000, "steps per algorithm in TestDifferential")
	diffSeed  = flag.Uint64("sluice.diffseed", 0, "seed of TestDifferential; 0 picks one")
)

// model is the Go side of the differential test: one algorithm's state,
// held in Go and evolved by internal/algorithm the way memstore does (the
// new state is kept only when the decision admits a positive cost).
type model interface {
	decide(p algorithm.Params, now, cost int64) algorithm.Decision
}

// refunder is a model whose algorithm has a Refund, applied as memstore
// applies it: the new state is always kept.
type refunder interface {
	refund(p algorithm.Params, now, n int64) algorithm.Decision
}

func (m *fixedWindowModel) refund(p algorithm.Params, now, n int64) (d algorithm.Decision) {
	m.s, d = m.s.Refund(p, now, n)
	return d
}

func (m *slidingLogModel) refund(p algorithm.Params, now, n int64) (d algorithm.Decision) {
	m.s, d = algorithm.SlidingLog{Entries: slices.Clone(m.s.Entries)}.Refund(p, now, n)
	return d
}

func (m *tokenBucketModel) refund(p algorithm.Params, now, n int64) (d algorithm.Decision) {
	m.s, d = m.s.Refund(p, now, n)
	return d
}

func (m *gcraModel) refund(p algorithm.Params, now, n int64) (d algorithm.Decision) {
	m.s, d = m.s.Refund(p, now, n)
	return d
}

type fixedWindowModel struct{ s algorithm.FixedWindow }

func (m *fixedWindowModel) decide(p algorithm.Params, now, cost int64) algorithm.Decision {
	s, d := m.s.Decide(p, now, cost)
	if d.Allowed && cost > 0 {
		m.s = s
	}
	return d
}

type slidingLogModel struct{ s algorithm.SlidingLog }

func (m *slidingLogModel) decide(p algorithm.Params, now, cost int64) algorithm.Decision {
	s, d := algorithm.SlidingLog{Entries: slices.Clone(m.s.Entries)}.Decide(p, now, cost)
	if d.Allowed && cost > 0 {
		m.s = s
	}
	return d
}

type slidingWindowModel struct{ s algorithm.SlidingWindow }

func (m *slidingWindowModel) decide(p algorithm.Params, now, cost int64) algorithm.Decision {
	s, d := m.s.Decide(p, now, cost)
	if d.Allowed && cost > 0 {
		m.s = s
	}
	return d
}

type tokenBucketModel struct{ s algorithm.TokenBucket }

func (m *tokenBucketModel) decide(p algorithm.Params, now, cost int64) algorithm.Decision {
	s, d := m.s.Decide(p, now, cost)
	if d.Allowed && cost > 0 {
		m.s = s
	}
	return d
}

type gcraModel struct{ s algorithm.GCRA }

func (m *gcraModel) decide(p algorithm.Params, now, cost int64) algorithm.Decision {
	s, d := m.s.Decide(p, now, cost)
	if d.Allowed && cost > 0 {
		m.s = s
	}
	return d
}

func newModel(a sluice.Algorithm) model {
	switch a {
	case sluice.FixedWindow:
		return &fixedWindowModel{}
	case sluice.SlidingLog:
		return &slidingLogModel{}
	case sluice.SlidingWindow:
		return &slidingWindowModel{}
	case sluice.TokenBucket:
		return &tokenBucketModel{}
	default:
		return &gcraModel{}
	}
}

// randomPolicy draws valid policy numbers for a, favouring edge cases: 1ms
// windows, limits of 1, 100000 per second, 24h windows.
func randomPolicy(r *rand.Rand, id string, a sluice.Algorithm) *sluice.Policy {
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 10 * time.Second, time.Minute, time.Hour, 24 * time.Hour}
	limits := []int64{1, 2, 3, 5, 10, 100, 1000, 100_000}
	for {
		p := sluice.Policy{ID: id, Algorithm: a, Limit: limits[r.IntN(len(limits))], Window: windows[r.IntN(len(windows))]}
		switch r.IntN(4) {
		case 0:
			p.Window = time.Duration(1000+r.Int64N(86_400_000_000-1000)) * time.Microsecond
		case 1:
			p.Limit = 1 + r.Int64N(5000)
		case 2:
			p.Limit, p.Window = 100_000, time.Second
		}
		if a == sluice.TokenBucket || a == sluice.GCRA {
			switch r.IntN(3) {
			case 0:
				p.Burst = 1 + r.Int64N(p.Limit)
			case 1:
				p.Burst = p.Limit + r.Int64N(3*p.Limit)
			}
		}
		if p.Validate() == nil {
			p = p.WithDefaults()
			return &p
		}
	}
}

// randomCost draws a cost for p: peeks, ones, and now and then anything up
// to the maximum.
func randomCost(r *rand.Rand, p *sluice.Policy) int64 {
	switch r.IntN(10) {
	case 0, 1:
		return 0
	case 2, 3, 4, 5:
		return 1
	case 6:
		return p.MaxCost
	case 7:
		return 1 + r.Int64N(min(p.MaxCost, 1000))
	default:
		return 1 + r.Int64N(min(p.MaxCost, 5))
	}
}

// randomStep draws a clock step for a policy of window w: none, 1µs,
// sub-millisecond, within the window, beyond it, or backwards.
func randomStep(r *rand.Rand, w int64) int64 {
	switch r.IntN(10) {
	case 0:
		return 0
	case 1:
		return 1
	case 2, 3:
		return r.Int64N(1000)
	case 4, 5:
		return r.Int64N(w / 4)
	case 6:
		return r.Int64N(w)
	case 7:
		return w + r.Int64N(2*w)
	case 8:
		return -r.Int64N(1000)
	default:
		return -r.Int64N(w)
	}
}

func statusOf(p *sluice.Policy, d algorithm.Decision) sluice.Status {
	return sluice.StatusFromMicros(p, d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter)
}

// TestDifferential drives random operation sequences through the Go math
// (internal/algorithm, held the way memstore holds it) and through the Lua
// script in caller-clock mode, and demands identical statuses.
func TestDifferential(t *testing.T) {
	seed := *diffSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -sluice.diffseed=%d)", seed, seed)
	c := standaloneClient(t)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			s, clock := callerStore(t, c)
			r := rand.New(rand.NewPCG(seed, uint64(a)))
			const episode = 500 // steps per policy before new numbers and a new key
			var (
				p    *sluice.Policy
				m    model
				subj string
				now  int64
			)
			var allowed, denied, regressions, refunds, changes int
			defer func() {
				t.Logf("%d steps: %d allowed, %d denied, %d refunds, %d with the clock moved back, %d policy changes under one revision", *diffSteps, allowed, denied, refunds, regressions, changes)
			}()
			for step := range *diffSteps {
				switch {
				case step%episode == 0:
					p = randomPolicy(r, "diff", a)
					m = newModel(a)
					subj = fmt.Sprintf("%s.%d.%d", subject(t), seed, step)
					now = sluicetest0 + r.Int64N(1_000_000_000)
				case r.IntN(20) == 0:
					// New numbers under the same revision: the state written
					// under the old ones is read under these.
					p = randomPolicy(r, "diff", a)
					changes++
				}
				dt := randomStep(r, p.Window.Microseconds())
				if dt < 0 {
					regressions++
				}
				now = max(now+dt, 1)
				cost := randomCost(r, p)
				clock.Set(time.UnixMicro(now))
				prm := algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst}
				rf, refund := m.(refunder)
				refund = refund && cost > 0 && r.IntN(8) == 0
				var want sluice.Status
				if refund {
					refunds++
					want = statusOf(p, rf.refund(prm, now, cost))
				} else {
					want = statusOf(p, m.decide(prm, now, cost))
				}
				ev := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, Cost: cost, Refund: refund}
				err := s.Evaluate(context.Background(), ev)
				got := ev.Statuses
				if err != nil {
					t.Fatalf("seed %d step %d: policy %+v now=%d: Evaluate(cost=%d, refund=%v): %v", seed, step, *p, now, cost, refund, err)
				}
				if want.Allowed {
					allowed++
				} else {
					denied++
				}
				if got[0] != want {
					t.Fatalf("seed %d step %d: policy %+v now=%d: Evaluate(cost=%d, refund=%v) = %+v, want %+v", seed, step, *p, now, cost, refund, got[0], want)
				}
			}
		})
	}
	t.Run("multi", func(t *testing.T) {
		t.Parallel()
		s, clock := callerStore(t, c)
		r := rand.New(rand.NewPCG(seed, 99))
		const episode = 200
		var (
			ps   []*sluice.Policy
			ms   []model
			subj string
			now  int64
		)
		for step := range *diffSteps / 5 {
			if step%episode == 0 {
				ps, ms = nil, nil
				for i := range 1 + r.IntN(4) {
					a := algorithms[r.IntN(len(algorithms))]
					ps = append(ps, randomPolicy(r, fmt.Sprint("p", i), a))
					ms = append(ms, newModel(a))
				}
				subj = fmt.Sprintf("%s.%d.%d", subject(t), seed, step)
				now = sluicetest0 + r.Int64N(1_000_000_000)
			}
			now = max(now+randomStep(r, ps[0].Window.Microseconds()), 1)
			cost := randomCost(r, ps[0])
			for _, p := range ps {
				cost = min(cost, p.MaxCost)
			}
			clock.Set(time.UnixMicro(now))
			// All or nothing: decide every policy on a peek-free copy
			// first, then commit only when every one admits.
			want := make([]sluice.Status, len(ps))
			admit := true
			for i, p := range ps {
				prm := algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst}
				d := clone(ms[i]).decide(prm, now, cost)
				want[i] = statusOf(p, d)
				admit = admit && d.Allowed
			}
			if !admit && len(ps) > 1 {
				// memstore: the policies that would have admitted report
				// their unspent state.
				for i, p := range ps {
					if want[i].Allowed {
						prm := algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst}
						d := clone(ms[i]).decide(prm, now, 0)
						want[i] = sluice.StatusFromMicros(p, true, d.Limit, d.Remaining, d.ResetAfter, 0)
					}
				}
			}
			if admit && cost > 0 {
				for i, p := range ps {
					ms[i].decide(algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst}, now, cost)
				}
			}
			got, err := evaluate(context.Background(), s, subj, cost, ps...)
			if err != nil {
				t.Fatalf("seed %d step %d: now=%d: Evaluate(cost=%d): %v", seed, step, now, cost, err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: now=%d: Evaluate(cost=%d) = %+v, want %+v", seed, step, now, cost, got, want)
			}
		}
	})
}

// sluicetest0 is 2026-01-01T00:00:00Z in µs, where the differential runs start.
const sluicetest0 = 1_767_225_600_000_000

// clone copies a model so deciding on it leaves the original untouched.
func clone(m model) model {
	switch m := m.(type) {
	case *fixedWindowModel:
		c := *m
		return &c
	case *slidingLogModel:
		return &slidingLogModel{algorithm.SlidingLog{Entries: slices.Clone(m.s.Entries)}}
	case *slidingWindowModel:
		c := *m
		return &c
	case *tokenBucketModel:
		c := *m
		return &c
	case *gcraModel:
		c := *m
		return &c
	}
	panic("unknown model")
}
