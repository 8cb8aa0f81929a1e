package algorithm

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
)

// fuzzRun drives kind k with the operations encoded in data, spends held
// ones among them, and checks the invariants of the package documentation
// plus the algorithm's own bound on admissions over intervals. Time never goes backwards here
// (TestJumpBackwards covers that), so the bounds are about real intervals.
func fuzzRun(t *testing.T, k Kind, aligned bool, limit, burst uint16, window uint32, ops []byte) {
	p := Params{Limit: 1 + int64(limit%64), Window: MinWindow + int64(window)%(20*sec), Burst: 1 + int64(burst%64), Aligned: aligned}
	if k != KindTokenBucket && k != KindGCRA {
		p.Burst = p.Limit
	}
	if err := p.Check(k); err != nil {
		t.Skip(err)
	}
	capacity := p.Capacity(k)
	m := newMachine(k, p)
	now := t0 + int64(window%977)
	var admitted []admission
	for i := 0; i+3 <= len(ops) && i < 3*400; i += 3 {
		step := int64(binary.BigEndian.Uint16(ops[i:]))
		now += step * p.Window / 8192                 // 0 to 8 windows
		cost := int64(ops[i+2]&0x7f) % (capacity + 1) // 0 is a peek
		// The cost byte's top bit holds a spend, for as long as the
		// time step's low bits say, within what Check allows.
		var hold int64
		if most := maxHold(m.p); ops[i+2]&0x80 != 0 && cost > 0 && most > 0 {
			hold = 1 + step*7919%most
		}
		before, live := m.snapshot(), m.expires() > now
		d := m.spend(now, cost, hold)
		what := fmt.Sprintf("%v %+v op %d (now t0%+d, cost %d, hold %d)", k, p, i/3, now-t0, cost, hold)
		checkDecision(t, what, d, capacity)
		if live && (!d.Allowed || cost == 0) {
			// A live state is untouched by a denial or a peek (an expired
			// one may be re-based: it equals absent either way).
			if after := m.snapshot(); after != before {
				t.Fatalf("%s: allowed=%v cost=%d changed the state from %s to %s", what, d.Allowed, cost, before, after)
			}
		}
		if d.Allowed && cost > 0 {
			// A bucket's held block counts at its hold's end, where its
			// last unit may be used; a fixed window's within its window.
			at := now
			if k == KindTokenBucket || k == KindGCRA {
				at += hold
			}
			admitted = append(admitted, admission{at, cost})
			if e := m.expires(); e <= now {
				t.Fatalf("%s: state that holds an admission expires at %d, not after now", what, e)
			}
		}
		if !d.Allowed && hold*p.Limit+cost*p.Window <= p.Burst*p.Window {
			// RetryAfter is exact: 1µs earlier is still denied, at it
			// admitted (a block that no bucket fits beside its hold's
			// floor is never admitted: nothing to wait for).
			if early := m.clone().spend(now+d.RetryAfter-1, cost, hold); early.Allowed {
				t.Fatalf("%s: admitted 1µs before RetryAfter %d", what, d.RetryAfter)
			}
			if onTime := m.clone().spend(now+d.RetryAfter, cost, hold); !onTime.Allowed {
				t.Fatalf("%s: denied at RetryAfter %d: %+v", what, d.RetryAfter, onTime)
			}
		}
		if d.ResetAfter > 0 {
			if full := m.clone().decide(now+d.ResetAfter, 0); full.Remaining != capacity {
				t.Fatalf("%s: %d remaining after ResetAfter %d, want %d", what, full.Remaining, d.ResetAfter, capacity)
			}
		}
	}
	slices.SortStableFunc(admitted, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
	var err error
	all := func(i, j int) bool { return true }
	switch k {
	case KindFixedWindow:
		// Within any span shorter than a window: at most two windows' worth.
		err = checkBound(admitted, func(i, j int) bool { return admitted[j].at-admitted[i].at < p.Window }, func(int64) int64 { return 2 * p.Limit })
		if err == nil && p.Aligned {
			// On the clock: exact per window of the epoch's boundaries.
			err = checkBound(admitted, func(i, j int) bool { return admitted[i].at/p.Window == admitted[j].at/p.Window }, func(int64) int64 { return p.Limit })
		}
	case KindSlidingLog:
		err = checkBound(admitted, func(i, j int) bool { return admitted[j].at-admitted[i].at < p.Window }, func(int64) int64 { return p.Limit })
	case KindSlidingWindow:
		// Exact per aligned window; at most 2 × Limit in any window-length span.
		err = checkBound(admitted, func(i, j int) bool { return admitted[i].at/p.Window == admitted[j].at/p.Window }, func(int64) int64 { return p.Limit })
		if err == nil {
			err = checkBound(admitted, func(i, j int) bool { return admitted[j].at-admitted[i].at < p.Window }, func(int64) int64 { return 2 * p.Limit })
		}
	case KindTokenBucket, KindGCRA:
		// Burst plus what the rate refills over the span.
		err = checkBound(admitted, all, func(span int64) int64 { return p.Burst + span*p.Limit/p.Window })
	}
	if err != nil {
		t.Fatalf("%v %+v: %v", k, p, err)
	}
}

func fuzzAlgorithm(f *testing.F, k Kind, aligned bool) {
	f.Add(uint16(3), uint16(3), uint32(10*sec), []byte{0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 40, 0, 1})
	f.Add(uint16(10), uint16(5), uint32(sec), []byte{0, 1, 5, 0, 1, 5, 0, 1, 5, 1, 0, 0, 0, 9, 3, 0, 200, 10})
	f.Add(uint16(1), uint16(1), uint32(0), []byte{0, 0, 1, 0, 100, 1, 31, 255, 1, 0, 3, 0})
	f.Add(uint16(63), uint16(20), uint32(7*sec+13), []byte{9, 9, 9, 200, 1, 63, 0, 0, 63, 0, 77, 2, 0, 0, 0})
	// Held spends (the cost byte's top bit): a block, one just after, one at the hold's end.
	f.Add(uint16(9), uint16(9), uint32(sec), []byte{0, 0, 0x85, 0, 0, 1, 12, 34, 0x83, 0, 1, 0x8a, 40, 0, 0x82})
	f.Fuzz(func(t *testing.T, limit, burst uint16, window uint32, ops []byte) {
		fuzzRun(t, k, aligned, limit, burst, window, ops)
	})
}

func FuzzFixedWindow(f *testing.F)        { fuzzAlgorithm(f, KindFixedWindow, false) }
func FuzzFixedWindowAligned(f *testing.F) { fuzzAlgorithm(f, KindFixedWindow, true) }
func FuzzSlidingLog(f *testing.F)         { fuzzAlgorithm(f, KindSlidingLog, false) }
func FuzzSlidingWindow(f *testing.F)      { fuzzAlgorithm(f, KindSlidingWindow, false) }
func FuzzTokenBucket(f *testing.F)        { fuzzAlgorithm(f, KindTokenBucket, false) }
func FuzzGCRA(f *testing.F)               { fuzzAlgorithm(f, KindGCRA, false) }
