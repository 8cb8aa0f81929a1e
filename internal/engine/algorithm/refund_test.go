package algorithm

import (
	"fmt"
	"testing"
)

var refundKinds = []Kind{KindFixedWindow, KindSlidingLog, KindTokenBucket, KindGCRA}

// TestRefundUndoesSpend: spending c and refunding c at the same instant
// leaves exactly the state a peek saw before, for every c and history.
func TestRefundUndoesSpend(t *testing.T) {
	for _, k := range refundKinds {
		p := Params{Limit: 7, Window: 3 * sec, Burst: 5}
		if k != KindTokenBucket && k != KindGCRA {
			p.Burst = p.Limit
		}
		m := newMachine(k, p)
		now := t0
		for step := int64(0); step < 200; step++ {
			now += (step * 7919) % (2 * sec)
			c := 1 + step%p.Capacity(k)
			before := m.decide(now, 0)
			d := m.decide(now, c)
			if !d.Allowed {
				continue
			}
			after := m.refund(now, c)
			if after != before {
				t.Fatalf("%v step %d: spend %d then refund %d = %+v, want the state before %+v", k, step, c, c, after, before)
			}
			m.decide(now, c) // keep the spend, so the history grows
		}
	}
}

// TestRefundNeverExceedsCapacity refunds far more than was ever spent.
func TestRefundNeverExceedsCapacity(t *testing.T) {
	for _, k := range refundKinds {
		p := Params{Limit: 4, Window: sec, Burst: 4}
		m := newMachine(k, p)
		for i, now := range []int64{t0, t0 + 1, t0 + sec/2, t0 - sec, t0 + 5*sec} {
			m.decide(now, 2)
			d := m.refund(now, 4)
			checkDecision(t, fmt.Sprintf("%v refund %d", k, i), d, p.Capacity(k))
			if !d.Allowed || d.Remaining > p.Capacity(k) {
				t.Fatalf("%v refund %d = %+v, want allowed with remaining ≤ %d", k, i, d, p.Capacity(k))
			}
		}
	}
}

// TestLoweredPolicy evaluates state written under larger numbers with
// smaller ones of the same revision: the state is clamped, never read as
// negative remaining or an out-of-range wait.
func TestLoweredPolicy(t *testing.T) {
	big := Params{Limit: 100, Window: 60 * sec, Burst: 100}
	small := []Params{
		{Limit: 3, Window: 60 * sec, Burst: 3},
		{Limit: 100, Window: sec, Burst: 100},
		{Limit: 2, Window: sec, Burst: 1},
	}
	for _, k := range kinds {
		for _, sp := range small {
			if k != KindTokenBucket && k != KindGCRA {
				sp.Burst = sp.Limit
			}
			m := newMachine(k, big)
			m.decide(t0, 60)
			setParams(m, sp)
			for i, now := range []int64{t0, t0 + 1, t0 + sec, t0 + 30*sec, t0 + 61*sec, t0 + 200*sec} {
				d := m.decide(now, 1)
				checkDecision(t, fmt.Sprintf("%v %+v → %+v step %d", k, big, sp, i), d, sp.Capacity(k))
			}
		}
	}
}

// TestChangedNumbers: bucket state written under one window or rate is read
// under another as the same whole number of units.
func TestChangedNumbers(t *testing.T) {
	minute := Params{Limit: 10, Window: 60 * sec, Burst: 10}
	second := Params{Limit: 10, Window: sec, Burst: 10}
	slow := Params{Limit: 1, Window: sec, Burst: 10}
	for _, k := range []Kind{KindTokenBucket, KindGCRA} {
		for _, c := range []struct{ from, to Params }{{minute, second}, {second, minute}, {second, slow}, {slow, minute}} {
			m := newMachine(k, c.from)
			m.decide(t0, 5)
			setParams(m, c.to)
			if d := m.decide(t0, 0); d.Remaining != 5 {
				t.Errorf("%v: 5 of 10 spent under %+v, read under %+v: remaining %d, want 5", k, c.from, c.to, d.Remaining)
			}
			// The rest refills at the new rate: 5 units take 5 intervals.
			interval := c.to.Window / c.to.Limit
			if d := m.decide(t0+5*interval-1, 0); d.Remaining != 9 {
				t.Errorf("%v %+v → %+v: remaining %d one µs before the fifth interval, want 9", k, c.from, c.to, d.Remaining)
			}
			if d := m.decide(t0+5*interval, 0); d.Remaining != 10 {
				t.Errorf("%v %+v → %+v: remaining %d after five intervals, want 10", k, c.from, c.to, d.Remaining)
			}
		}
	}
}

func setParams(m *machine, p Params) { m.p.Params = p }
