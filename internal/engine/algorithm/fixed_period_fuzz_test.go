package algorithm

import (
	"encoding/binary"
	"testing"
)

// FuzzFixedPeriod drives a calendar period's fixed window over a made-up
// calendar (boundaries of 1 to 65 536 µs, from the fuzzer's bytes), its
// bounds computed around each request's time as a store computes them,
// and checks: never more than the limit admitted in one period, 0 <=
// remaining <= limit, a denial's Retry-After and every reset exactly at
// the end of the period holding the request, and the state expiring at
// that end.
func FuzzFixedPeriod(f *testing.F) {
	f.Add(uint16(3), []byte{0, 10, 0, 50, 1, 0, 0, 20, 2, 1, 0, 0, 3, 255, 255, 1})
	f.Add(uint16(1), []byte{255, 255, 0, 0, 0, 1, 0, 1, 1})
	f.Fuzz(func(t *testing.T, limit uint16, ops []byte) {
		lim := 1 + int64(limit%16)
		// The calendar: boundaries from the first bytes, then regular.
		bounds := []int64{t0}
		for i := 0; len(bounds) < 400; i += 2 {
			gap := int64(1 + i%7*97)
			if i+2 <= len(ops) {
				gap = 1 + int64(binary.BigEndian.Uint16(ops[i:]))
			}
			bounds = append(bounds, bounds[len(bounds)-1]+gap)
		}
		around := func(now int64) (Policy, int64, bool) {
			for i := 1; i+2 < len(bounds); i++ {
				if bounds[i] <= now && now < bounds[i+1] {
					return periodPolicy(lim, [4]int64{bounds[i-1], bounds[i], bounds[i+1], bounds[i+2]}), bounds[i+1], true
				}
			}
			return Policy{}, 0, false
		}
		var st State
		counts := map[int64]int64{} // admitted per period, by its end
		now := bounds[1]
		for i := 0; i+3 <= len(ops) && i < 3*300; i += 3 {
			now += int64(binary.BigEndian.Uint16(ops[i:])) % 4096
			p, end, ok := around(now)
			if !ok {
				return
			}
			cost := int64(ops[i+2]) % (lim + 1)
			d, err := decidePeriod(t, &p, &st, now, cost)
			if err != nil {
				t.Fatalf("at %d: %v", now, err)
			}
			if d.Remaining < 0 || d.Remaining > lim || d.Limit != lim || d.Allowed != (d.RetryAfter == 0) {
				t.Fatalf("at %d, cost %d: %+v out of bounds", now, cost, d)
			}
			if !d.Allowed && d.RetryAfter != end-now {
				t.Fatalf("at %d, cost %d: denied with Retry-After %d, want the period's end %d, %d away", now, cost, d.RetryAfter, end, end-now)
			}
			if d.ResetAfter != 0 && d.ResetAfter != end-now {
				t.Fatalf("at %d: reset after %d, want %d", now, d.ResetAfter, end-now)
			}
			if d.Allowed && cost > 0 {
				if counts[end] += cost; counts[end] > lim {
					t.Fatalf("period ending %d: %d admitted, limit %d", end, counts[end], lim)
				}
				if e := p.Expires(&st); e != end {
					t.Fatalf("at %d: state expires at %d, want the period's end %d", now, e, end)
				}
			}
		}
	})
}
