package algorithm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// leases runs one concurrency policy through Evaluate over a state it
// holds, as a store does.
type leases struct {
	p  Policy
	st *State
}

func (m *leases) run(now int64, ev Evaluation) Decision {
	ev.Policies, ev.States, ev.Now, ev.MaxRegression = []Policy{m.p}, []*State{m.st}, now, -1
	ev.Decisions, ev.Writes = make([]Decision, 1), make([]Write, 1)
	if err := Check(ev.Op, ev.Policies, ev.Cost, ev.Hold, ev.LeaseID, false); err != nil {
		panic(err)
	}
	if err := Evaluate(&ev); err != nil {
		panic(err)
	}
	if ev.Commit {
		if m.st == nil {
			m.st = new(State)
		}
		m.st.Apply(&ev.Writes[0])
		if ev.Writes[0].Expires <= now {
			m.st = nil // as a store deletes it
		}
	}
	return ev.Decisions[0]
}

func (m *leases) acquire(now int64, id string) Decision {
	return m.run(now, Evaluation{Op: OpAcquire, Cost: 1, LeaseID: id})
}
func (m *leases) peek(now int64) Decision { return m.run(now, Evaluation{Op: OpPeek}) }
func (m *leases) release(now int64, id string) Decision {
	return m.run(now, Evaluation{Op: OpRelease, LeaseID: id})
}
func (m *leases) renew(now int64, id string) Decision {
	return m.run(now, Evaluation{Op: OpRenew, LeaseID: id})
}

// TestConcurrencySteps: 2 at once with a 10s lease TTL.
func TestConcurrencySteps(t *testing.T) {
	m := &leases{p: Policy{Kind: KindConcurrency, Params: Params{Limit: 2, Window: 10 * sec, Burst: 2}}}
	steps := []struct {
		name string
		at   int64 // µs after t0
		do   func(now int64) Decision
		want Decision
	}{
		{"first lease", 0, func(n int64) Decision { return m.acquire(n, "a") }, Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 10 * sec}},
		{"second lease", sec, func(n int64) Decision { return m.acquire(n, "b") }, Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * sec}},
		{"third waits for a's expiry", 2 * sec, func(n int64) Decision { return m.acquire(n, "c") }, Decision{Limit: 2, Remaining: 0, ResetAfter: 9 * sec, RetryAfter: 8 * sec}},
		{"peek when full", 2 * sec, m.peek, Decision{Limit: 2, Remaining: 0, ResetAfter: 9 * sec, RetryAfter: 8 * sec}},
		{"release a", 3 * sec, func(n int64) Decision { return m.release(n, "a") }, Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 8 * sec}},
		{"release a again: harmless", 3 * sec, func(n int64) Decision { return m.release(n, "a") }, Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 8 * sec}},
		{"release unknown: harmless", 3 * sec, func(n int64) Decision { return m.release(n, "zz") }, Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 8 * sec}},
		{"c now fits", 4 * sec, func(n int64) Decision { return m.acquire(n, "c") }, Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * sec}},
		{"renew b moves its expiry", 5 * sec, func(n int64) Decision { return m.renew(n, "b") }, Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * sec}},
		{"d waits for c, the soonest now", 6 * sec, func(n int64) Decision { return m.acquire(n, "d") }, Decision{Limit: 2, Remaining: 0, ResetAfter: 9 * sec, RetryAfter: 8 * sec}},
		{"c expired: its holder died", 14 * sec, func(n int64) Decision { return m.acquire(n, "d") }, Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * sec}},
		{"release after expiry: harmless", 14 * sec, func(n int64) Decision { return m.release(n, "c") }, Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * sec}},
		{"renew of an expired lease acquires it afresh", 16 * sec, func(n int64) Decision { return m.renew(n, "b") }, Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * sec}},
		{"acquiring a held lease renews it", 17 * sec, func(n int64) Decision { return m.acquire(n, "b") }, Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 10 * sec}},
		{"release both", 18 * sec, func(n int64) Decision { m.release(n, "b"); return m.release(n, "d") }, Decision{Allowed: true, Limit: 2, Remaining: 2}},
	}
	for _, s := range steps {
		if got := s.do(t0 + s.at); got != s.want {
			t.Fatalf("%s: got %+v, want %+v", s.name, got, s.want)
		}
	}
	if m.st != nil {
		t.Fatalf("state after every lease went = %+v, want absent (deleted)", *m.st)
	}
}

// TestConcurrencyAgainstModel drives random acquisitions, renewals,
// releases and peeks, with the clock sometimes stepping back, and checks
// every answer against a plain map of leases: never more than Limit live,
// a denial only when Limit are live, its RetryAfter the exact wait, the
// state sorted and free of expired leases' influence.
func TestConcurrencyAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		p := Params{Limit: 1 + r.Int64N(5), Window: sec * (1 + r.Int64N(5))}
		p.Burst = p.Limit
		m := &leases{p: Policy{Kind: KindConcurrency, Params: p}}
		model := map[string]int64{} // lease -> expiry
		now := t0
		for step := range 200 {
			if r.IntN(6) == 0 {
				now -= r.Int64N(p.Window / 2)
			} else {
				now += r.Int64N(p.Window / 3)
			}
			at := now // the engine's clock rule: decided at the newest write when behind it
			if m.st != nil {
				if exp, nw := m.p.bounds(m.st); exp > now && nw > now {
					at = nw
				}
			}
			live := func() (n int64, soonest []int64) {
				for _, e := range model {
					if e > at {
						n++
						soonest = append(soonest, e)
					}
				}
				slices.Sort(soonest)
				return n, soonest
			}
			id := fmt.Sprint("l", r.IntN(8))
			what := fmt.Sprintf("trial %d step %d %+v at t0%+d", trial, step, p, now-t0)
			n, soonest := live()
			_, held := model[id]
			held = held && model[id] > at
			sweep := func() { // a write drops the leases expired by its time
				for k, e := range model {
					if e <= at {
						delete(model, k)
					}
				}
			}
			switch r.IntN(4) {
			case 0, 1: // acquire
				d := m.acquire(now, id)
				switch {
				case held || n < p.Limit:
					if !d.Allowed {
						t.Fatalf("%s: acquire %s with %d live (held %v) = %+v, want allowed", what, id, n, held, d)
					}
					model[id] = at + p.Window
					sweep()
				default:
					want := soonest[n-p.Limit] - now
					if d.Allowed || d.RetryAfter != want || d.Remaining != 0 {
						t.Fatalf("%s: acquire with %d live = %+v, want denied, RetryAfter %d", what, n, d, want)
					}
				}
			case 2: // release
				d := m.release(now, id)
				delete(model, id)
				sweep()
				left, _ := live()
				if !d.Allowed || d.Remaining != p.Limit-left {
					t.Fatalf("%s: release %s = %+v, want allowed with %d remaining", what, id, d, p.Limit-left)
				}
			case 3:
				d := m.peek(now)
				if d.Allowed != (n < p.Limit) || d.Remaining != max(p.Limit-n, 0) {
					t.Fatalf("%s: peek with %d live = %+v", what, n, d)
				}
			}
			if m.st != nil {
				if !slices.IsSorted(m.st.Log) || len(m.st.Log) != len(m.st.IDs) {
					t.Fatalf("%s: state %+v: want expiries sorted, one id each", what, *m.st)
				}
				if int64(len(m.st.Log)) > p.Limit+int64(len(model)) {
					t.Fatalf("%s: state holds %d leases", what, len(m.st.Log))
				}
			}
		}
	}
}

// TestConcurrencyJumpBackwards: a request from a clock behind the newest
// lease is decided at that lease's acquisition, so the new lease never
// expires before an older one and the wait it is told is never early.
func TestConcurrencyJumpBackwards(t *testing.T) {
	m := &leases{p: Policy{Kind: KindConcurrency, Params: Params{Limit: 2, Window: 10 * sec, Burst: 2}}}
	if d := m.acquire(t0, "a"); !d.Allowed {
		t.Fatalf("acquire = %+v, want allowed", d)
	}
	d := m.acquire(t0-3*sec, "b")
	if want := (Decision{Allowed: true, Limit: 2, ResetAfter: 13 * sec}); d != want {
		t.Fatalf("acquire 3s behind = %+v, want %+v", d, want)
	}
	if got := m.st.Log; !slices.Equal(got, []int64{t0 + 10*sec, t0 + 10*sec}) {
		t.Fatalf("expiries = %v, want both at t0+10s", got)
	}
	d = m.acquire(t0-3*sec, "c")
	if want := (Decision{Limit: 2, RetryAfter: 13 * sec, ResetAfter: 13 * sec}); d != want {
		t.Fatalf("third acquire 3s behind = %+v, want %+v", d, want)
	}
}

// FuzzConcurrency drives acquisitions, releases, renewals and peeks
// encoded in ops (time never going back) and checks: no more than Limit
// leases live at once; 0 ≤ Remaining ≤ Limit; RetryAfter is 0 exactly
// when allowed, and when denied it is exact (1µs earlier still denied,
// at it admitted) as long as nothing is released meanwhile.
func FuzzConcurrency(f *testing.F) {
	f.Add(uint16(2), uint32(10*sec), []byte{0, 0, 0, 0, 0, 1, 0, 0, 2, 1, 0, 0, 0, 9, 3})
	f.Add(uint16(1), uint32(0), []byte{0, 1, 0, 0, 1, 1, 255, 0, 0, 3, 0, 4})
	f.Add(uint16(63), uint32(7*sec+13), []byte{9, 9, 9, 200, 1, 63, 0, 0, 63, 0, 77, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, limit uint16, ttl uint32, ops []byte) {
		p := Params{Limit: 1 + int64(limit%64), Window: MinWindow + int64(ttl)%(20*sec)}
		p.Burst = p.Limit
		m := &leases{p: Policy{Kind: KindConcurrency, Params: p}}
		now := t0
		held := map[string]int64{} // lease -> expiry, as the caller knows it
		for i := 0; i+3 <= len(ops) && i < 3*400; i += 3 {
			now += int64(ops[i]) * p.Window / 64 // 0 to 4 TTLs
			id := fmt.Sprint("l", ops[i+1]%16)
			var d Decision
			what := fmt.Sprintf("%+v op %d (now t0%+d)", p, i/3, now-t0)
			switch ops[i+2] % 4 {
			case 0, 1:
				d = m.acquire(now, id)
				if d.Allowed {
					held[id] = now + p.Window
				}
				if !d.Allowed {
					c := &leases{p: m.p, st: cloneState(m.st)}
					if early := c.acquire(now+d.RetryAfter-1, "probe"); early.Allowed {
						t.Fatalf("%s: admitted 1µs before RetryAfter %d", what, d.RetryAfter)
					}
					c = &leases{p: m.p, st: cloneState(m.st)}
					if onTime := c.acquire(now+d.RetryAfter, "probe"); !onTime.Allowed {
						t.Fatalf("%s: denied at RetryAfter %d: %+v", what, d.RetryAfter, onTime)
					}
				}
			case 2:
				d = m.release(now, id)
				delete(held, id)
			case 3:
				d = m.peek(now)
			}
			if d.Remaining < 0 || d.Remaining > p.Limit || d.Allowed != (d.RetryAfter == 0) {
				t.Fatalf("%s: %+v breaks 0 ≤ remaining ≤ limit or RetryAfter = 0 iff allowed", what, d)
			}
			live := 0
			for _, e := range held {
				if e > now {
					live++
				}
			}
			if int64(live) > p.Limit {
				t.Fatalf("%s: %d leases live at once, limit %d", what, live, p.Limit)
			}
		}
	})
}

func cloneState(st *State) *State {
	if st == nil {
		return nil
	}
	c := *st
	c.Log, c.IDs = slices.Clone(st.Log), slices.Clone(st.IDs)
	return &c
}
