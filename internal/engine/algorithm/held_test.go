package algorithm

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// maxHold returns the longest hold Check lets p take, µs; 0 when p's
// algorithm takes none.
func maxHold(p Policy) int64 {
	switch p.Kind {
	case KindFixedWindow:
		return p.Params.Window
	case KindTokenBucket, KindGCRA:
		return min(p.Params.Window, p.Params.Burst*p.Params.Window/p.Params.Limit)
	}
	return 0
}

// randomHold draws a hold p may take, µs, from 1µs to the longest,
// favouring both ends; 0 when p's algorithm takes none.
func randomHold(r *rand.Rand, p Policy) int64 {
	most := maxHold(p)
	switch {
	case most == 0:
		return 0
	case r.IntN(4) == 0:
		return 1
	case r.IntN(3) == 0:
		return most
	}
	return 1 + r.Int64N(most)
}

// TestHeldSteps: held spends, row by row, on the numbers worked by hand.
func TestHeldSteps(t *testing.T) {
	type row struct {
		name      string
		at        int64 // µs after t0
		cost      int64
		hold      int64 // µs; 0: a plain spend
		allowed   bool
		remaining int64
		retry     int64
		reset     int64
	}
	ms := sec / 1000
	// 10 per second, burst 10: an emission interval of 100ms.
	tenPerSecond := []row{
		{"fresh, held 5 for 300ms: the floor takes 3", 0, 5, 300 * ms, true, 2, 0, 800 * ms},
		{"a plain spend just after sees 1 left", 0, 1, 0, true, 1, 0, 900 * ms},
		{"held 1 for 100ms: the debt is above the floor", 0, 1, 100 * ms, true, 0, 0, sec},
		{"held 1 more: no room", 0, 1, 100 * ms, false, 0, 100 * ms, sec},
	}
	// The floor denies what a plain spend would get: the held view.
	floor := []row{
		{"a plain spend leaves 8", 0, 2, 0, true, 8, 0, 200 * ms},
		{"held 8 for 300ms: 7 fit beside the floor", 0, 8, 300 * ms, false, 7, 100 * ms, 300 * ms},
		{"held 7 for 300ms fits", 0, 7, 300 * ms, true, 0, 0, sec},
	}
	// 10 per 10s, burst 10: an interval of 1s. Last is now, not now +
	// hold: a request just after the block is decided at its own time and
	// denied (decided at now + hold it would find 5 units free).
	counterexample := []row{
		{"5 of 10 left", 0, 5, 0, true, 5, 0, 5 * sec},
		{"held 5 for 5s: the debt is the floor", 0, 5, 5 * sec, true, 0, 0, 10 * sec},
		{"just after: denied", 1, 1, 0, false, 0, sec - 1, 10*sec - 1},
		{"at the hold's end one interval is back", 5 * sec, 5, 0, true, 0, 0, 10 * sec},
	}
	cases := []struct {
		name string
		kind Kind
		p    Params
		rows []row
	}{
		{"ten per second", KindGCRA, Params{Limit: 10, Window: sec, Burst: 10}, tenPerSecond},
		{"ten per second", KindTokenBucket, Params{Limit: 10, Window: sec, Burst: 10}, tenPerSecond},
		{"floor", KindGCRA, Params{Limit: 10, Window: sec, Burst: 10}, floor},
		{"floor", KindTokenBucket, Params{Limit: 10, Window: sec, Burst: 10}, floor},
		{"counterexample", KindGCRA, Params{Limit: 10, Window: 10 * sec, Burst: 10}, counterexample},
		{"counterexample", KindTokenBucket, Params{Limit: 10, Window: 10 * sec, Burst: 10}, counterexample},
		{"the window's own count", KindFixedWindow, Params{Limit: 3, Window: 10 * sec, Burst: 3}, []row{
			{"held 2 for 1s", 0, 2, sec, true, 1, 0, 10 * sec},
			{"one more", sec / 2, 1, 0, true, 0, 0, 10*sec - sec/2},
			{"held 1: full", sec, 1, sec, false, 0, 9 * sec, 9 * sec},
		}},
	}
	for _, c := range cases {
		t.Run(c.kind.String()+"/"+c.name, func(t *testing.T) {
			m := newMachine(c.kind, c.p)
			for _, r := range c.rows {
				op := OpHold
				if r.hold == 0 {
					op = OpSpend
				}
				if err := Check(op, []Policy{m.p}, r.cost, r.hold, "", false); err != nil {
					t.Fatalf("%s: %v", r.name, err)
				}
				got := m.held(t0+r.at, r.cost, r.hold)
				want := Decision{Allowed: r.allowed, Limit: c.p.Capacity(c.kind), Remaining: r.remaining, RetryAfter: r.retry, ResetAfter: r.reset}
				if got != want {
					t.Fatalf("%s: Decide(t0%+dµs, cost=%d, hold=%d) = %+v, want %+v", r.name, r.at, r.cost, r.hold, got, want)
				}
			}
		})
	}
}

// heldRun drives a policy of kind k with p through steps random
// decisions, plain spends and held ones, at times that never go back,
// and returns the units its caller really used, one admission each at
// its own time, sorted: a plain spend's at the decision, a held block's
// at random times within its hold (half of them at its very end), and
// for a fixed window only before the window that holds the decision
// ends. With dated false the store is told no hold (each block is a
// plain spend of its cost) while its units are still used over the
// hold: the mutation the bound must catch.
func heldRun(r *rand.Rand, k Kind, p Params, steps int, dated bool) []admission {
	m := newMachine(k, p)
	most := maxHold(m.p)
	now := t0 + r.Int64N(p.Window)
	var used []admission
	for range steps {
		switch r.IntN(3) {
		case 0:
			now += r.Int64N(p.Window / p.Limit) // within an emission interval
		case 1:
			now += r.Int64N(most + 1)
		default:
			now += r.Int64N(1000)
		}
		if r.IntN(3) == 0 {
			cost := 1 + r.Int64N(min(3, p.Capacity(k)))
			if d := m.decide(now, cost); d.Allowed {
				used = append(used, admission{now, cost})
			}
			continue
		}
		cost, hold := 1+r.Int64N(p.Capacity(k)), randomHold(r, m.p)
		told := hold
		if !dated {
			told = 0
		}
		d := m.held(now, cost, told)
		if !d.Allowed {
			continue
		}
		end := now + hold
		if k == KindFixedWindow {
			end = min(end, now+d.ResetAfter-1) // the block ends with the window
		}
		for range cost {
			at := end
			if r.IntN(2) == 0 {
				at = now + r.Int64N(end-now+1)
			}
			used = append(used, admission{at, 1})
		}
	}
	slices.SortFunc(used, func(a, b admission) int { return int(a.at - b.at) })
	return used
}

// heldBound checks used, the units of a heldRun, against the bound of
// the plain algorithm: for the buckets at most Burst + ⌊span·Limit /
// Window⌋ units in any closed interval, for an aligned fixed window at
// most Limit in each window of the clock.
func heldBound(k Kind, p Params, used []admission) error {
	if k == KindFixedWindow {
		return checkBound(used, func(i, j int) bool { return used[i].at/p.Window == used[j].at/p.Window }, func(int64) int64 { return p.Limit })
	}
	return checkBound(used, func(i, j int) bool { return true }, func(span int64) int64 { return p.Burst + span*p.Limit/p.Window })
}

// TestHeldBlocksCoverTheirUse: held blocks whose units are used at any
// times within their holds, beside plain spends at their own times, never
// let more units through in any interval than the plain algorithm allows.
func TestHeldBlocksCoverTheirUse(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, k := range []Kind{KindTokenBucket, KindGCRA, KindFixedWindow} {
		t.Run(k.String(), func(t *testing.T) {
			for trial := range 60 {
				p := Params{Limit: 1 + r.Int64N(10), Window: sec/10 + r.Int64N(10*sec), Aligned: k == KindFixedWindow}
				p.Burst = p.Limit
				if k != KindFixedWindow {
					p.Burst = 1 + r.Int64N(10)
				}
				used := heldRun(r, k, p, 200, true)
				if err := heldBound(k, p, used); err != nil {
					t.Fatalf("trial %d, %v %+v, %d units used: %v", trial, k, p, len(used), err)
				}
			}
		})
	}
}

// TestUndatedBlocksBreakTheBound: the same runs with each block spent as
// a plain spend while its units are used over the hold break the bound,
// so TestHeldBlocksCoverTheirUse can fail.
func TestUndatedBlocksBreakTheBound(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, k := range []Kind{KindTokenBucket, KindGCRA} {
		broken := 0
		for range 60 {
			p := Params{Limit: 1 + r.Int64N(10), Window: sec/10 + r.Int64N(10*sec), Burst: 1 + r.Int64N(10)}
			if heldBound(k, p, heldRun(r, k, p, 200, false)) != nil {
				broken++
			}
		}
		if broken == 0 {
			t.Errorf("%v: no undated run of 60 broke the bound", k)
		}
		t.Logf("%v: %d of 60 undated runs broke the bound", k, broken)
	}
}
