package algorithm

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// book books cost on m at now, waiting up to mostWait µs (an OpBook that
// passed Check).
func (m *machine) book(now, cost, mostWait int64) Decision {
	if err := Check(OpBook, []Policy{m.p}, cost, mostWait, "", false); err != nil {
		panic(err)
	}
	return m.eval(now, OpBook, cost, mostWait)
}

// TestBookSpacesWaiters: bookings taken at one instant on gcra and
// token_bucket are admitted at once up to the burst, then each a further
// emission interval later; past the most wait one is denied and books
// nothing, and one exactly at it is admitted (the bound is inclusive, to
// the µs); the schedule then serves the booked slots in order, and a
// spend at a slot's time is denied (the slot is taken).
func TestBookSpacesWaiters(t *testing.T) {
	p := Params{Limit: 200, Window: sec, Burst: 2} // T = 5ms
	const T = 5_000
	for _, k := range []Kind{KindGCRA, KindTokenBucket} {
		m := newMachine(k, p)
		for i, want := range []int64{0, 0, T, 2 * T, 3 * T} {
			d := m.book(t0, 1, 3*T)
			if !d.Allowed || d.Delay != want || d.RetryAfter != 0 {
				t.Fatalf("%v: book %d at t0 = %+v, want admitted with delay %d", k, i, d, want)
			}
		}
		before := m.snapshot()
		if d := m.book(t0, 1, 3*T); d.Allowed || d.Delay != 0 || d.RetryAfter != 4*T {
			t.Fatalf("%v: a booking past the most wait = %+v, want denied, retry after %d", k, d, 4*T)
		}
		if m.snapshot() != before {
			t.Fatalf("%v: a denied booking changed the state", k)
		}
		if d := m.book(t0, 1, 4*T); !d.Allowed || d.Delay != 4*T {
			t.Fatalf("%v: a booking exactly at the most wait = %+v, want admitted with delay %d", k, d, 4*T)
		}
		if d := m.decide(t0+4*T, 1); d.Allowed {
			t.Fatalf("%v: a spend at the last booked slot = %+v, want denied: the slot is taken", k, d)
		}
		if d := m.book(t0+4*T, 1, 0); d.Allowed || d.RetryAfter != T {
			t.Fatalf("%v: a booking with no wait at the last slot = %+v, want denied, retry after %d", k, d, T)
		}
	}
}

// TestBookMatchesDecideWhenItFits: a booking that fits now is the spend,
// decision and state alike.
func TestBookMatchesDecideWhenItFits(t *testing.T) {
	p := Params{Limit: 10, Window: sec, Burst: 5}
	for _, k := range []Kind{KindGCRA, KindTokenBucket} {
		a, b := newMachine(k, p), newMachine(k, p)
		for i := range 5 {
			da, db := a.decide(t0+int64(i), 1), b.book(t0+int64(i), 1, sec)
			if da != db || a.snapshot() != b.snapshot() {
				t.Fatalf("%v step %d: spend %+v (%s), book %+v (%s): want the same", k, i, da, a.snapshot(), db, b.snapshot())
			}
		}
	}
}

// TestBookTokenBucketMatchesGCRA: for the same numbers the two bucket
// algorithms book alike, among spends, refunds and peeks, with the clock
// stepping back, and after the window changes under them (both start
// from an empty bucket at most: booked debt is not carried across).
func TestBookTokenBucketMatchesGCRA(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		p := Params{Limit: 1 + r.Int64N(20), Window: sec * (1 + r.Int64N(10)), Burst: 1 + r.Int64N(20)}
		tb, gcra := newMachine(KindTokenBucket, p), newMachine(KindGCRA, p)
		now := t0
		for step := range 200 {
			switch r.IntN(6) {
			case 0:
				now -= r.Int64N(p.Window)
			case 1:
				q := p
				q.Window = sec * (1 + r.Int64N(10))
				setParams(tb, q)
				setParams(gcra, q)
			default:
				now += r.Int64N(p.Window / 2)
			}
			cost := 1 + r.Int64N(tb.p.Params.Burst)
			mostWait := r.Int64N(3 * tb.p.Params.Window)
			var a, b Decision
			switch r.IntN(4) {
			case 0:
				a, b = tb.decide(now, cost-1), gcra.decide(now, cost-1)
			case 1:
				a, b = tb.refund(now, cost), gcra.refund(now, cost)
			default:
				a, b = tb.book(now, cost, mostWait), gcra.book(now, cost, mostWait)
			}
			if a != b {
				t.Fatalf("trial %d step %d %+v: now t0%+d cost %d most wait %d: token_bucket %+v, gcra %+v", trial, step, tb.p.Params, now-t0, cost, mostWait, a, b)
			}
		}
	}
}

// TestBookBound: whatever the bookings, spends and most waits, the units
// admitted, each counted at its slot (the decision's time plus its
// delay), hold in any interval [a, b] at most Burst + ⌊(b − a + 1µs)·
// Limit / Window⌋ (a slot is a whole µs, the schedule a fraction of one:
// a booked slot may lie up to 1µs before its unit's exact time), and no
// delay passes its most wait.
func TestBookBound(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 100 {
		p := Params{Limit: 1 + r.Int64N(50), Window: sec, Burst: 1 + r.Int64N(10)}
		for _, k := range []Kind{KindGCRA, KindTokenBucket} {
			m := newMachine(k, p)
			var slots, units []int64
			now := t0
			for range 300 {
				now += r.Int64N(p.Window / p.Limit * 2)
				cost := 1 + r.Int64N(p.Burst)
				mostWait := r.Int64N(2 * p.Window)
				var d Decision
				if r.IntN(4) == 0 {
					d = m.decide(now, cost)
				} else {
					d = m.book(now, cost, mostWait)
				}
				if d.Delay > mostWait {
					t.Fatalf("%v trial %d: delay %d past the most wait %d", k, trial, d.Delay, mostWait)
				}
				if d.Allowed {
					slots, units = append(slots, now+d.Delay), append(units, cost)
				}
			}
			for i := range slots {
				for j := range slots {
					a, b := slots[i], slots[j]
					if b < a {
						continue
					}
					var in int64
					for x := range slots {
						if slots[x] >= a && slots[x] <= b {
							in += units[x]
						}
					}
					if most := p.Burst + (b-a+1)*p.Limit/p.Window; in > most {
						t.Fatalf("%v trial %d %+v: %d units at slots in [%d, %d], more than %d", k, trial, p, in, a-t0, b-t0, most)
					}
				}
			}
		}
	}
}

// TestBookClockLag: a booking whose time lies behind the state's newest
// write is decided at that write's time; its delay, counted from its own
// time, includes the lag and never passes the most wait.
func TestBookClockLag(t *testing.T) {
	p := Params{Limit: 200, Window: sec, Burst: 1} // T = 5ms
	m := newMachine(KindGCRA, p)
	m.book(t0, 1, 0)
	if d := m.book(t0-1000, 1, 5_000); d.Allowed {
		t.Fatalf("book 1ms behind, most wait 5ms = %+v: want denied (the slot is 6ms away)", d)
	}
	if d := m.book(t0-1000, 1, 6_000); !d.Allowed || d.Delay != 6_000 {
		t.Fatalf("book 1ms behind, most wait 6ms = %+v: want admitted with delay 6ms", d)
	}
}

// TestCheckBook: the rules of a booking, each refused with its reason.
func TestCheckBook(t *testing.T) {
	g := Policy{Kind: KindGCRA, Params: Params{Limit: 10, Window: sec, Burst: 10}, ID: "g", MaxCost: 10}
	fw := Policy{Kind: KindFixedWindow, Params: Params{Limit: 10, Window: sec, Burst: 10}, ID: "fw", MaxCost: 10}
	huge := Policy{Kind: KindGCRA, Params: Params{Limit: MaxLimit, Window: 8_000_000, Burst: MaxLimit}, ID: "huge", MaxCost: 1}
	for _, c := range []struct {
		name       string
		policies   []Policy
		cost, wait int64
		lease      string
		remembered bool
		want       string
	}{
		{"fits", []Policy{g}, 1, sec, "", false, ""},
		{"no wait", []Policy{g}, 1, 0, "", false, ""},
		{"two policies", []Policy{g, g}, 1, sec, "", false, "exactly one policy"},
		{"fixed window", []Policy{fw}, 1, sec, "", false, "only gcra and token_bucket"},
		{"id", []Policy{g}, 1, sec, "", true, "no evaluation id"},
		{"lease", []Policy{g}, 1, sec, "l", false, "no lease id"},
		{"no cost", []Policy{g}, 0, sec, "", false, "cost of 1 or more"},
		{"cost", []Policy{g}, 11, sec, "", false, "cost above policy maximum"},
		{"negative", []Policy{g}, 1, -1, "", false, "max wait = -1µs"},
		{"a day and more", []Policy{g}, 1, MaxMostWait + 1, "", false, "max wait"},
		{"inexact", []Policy{huge}, 1, sec, "", false, "stay exact"},
	} {
		err := Check(OpBook, c.policies, c.cost, c.wait, c.lease, c.remembered)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: Check = %v, want nil", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: Check = %v, want an error saying %q", c.name, err, c.want)
		case c.want != "" && !errors.Is(err, ErrInvalidRequest) && !errors.Is(err, ErrCostTooHigh):
			t.Errorf("%s: Check = %v, want ErrInvalidRequest", c.name, err)
		}
	}
}
