package main

import (
	"net/http"
	"testing"
	"time"
)

// admitted returns the answers of n admissions of subject 0 in the window
// that opened at open (1 s long), one every 10 ms from open, each with a
// round trip of rtt.
func admitted(open time.Duration, n, limit int, rtt time.Duration) []answer {
	var out []answer
	for k := range n {
		sent := open + time.Duration(k)*10*time.Millisecond
		decided := sent + rtt/2
		out = append(out, answer{status: http.StatusOK, sent: sent, recv: sent + rtt,
			remaining: int32(limit - k - 1), resetAfter: int32((open + window - decided).Milliseconds())})
	}
	return out
}

func TestCheckExactness(t *testing.T) {
	const limit = 20
	for _, c := range []struct {
		name               string
		answers            []answer
		windows, over, dup int
	}{
		{"two windows at the limit, back to back, slow round trips",
			append(admitted(0, limit, limit, 400*time.Millisecond), admitted(window, limit, limit, 400*time.Millisecond)...), 2, 0, 0},
		{"a window opened again 300 ms after the last (state lost)",
			append(admitted(0, limit, limit, time.Millisecond), admitted(300*time.Millisecond, 5, limit, time.Millisecond)...), 1, 5, 1},
		{"a window's count restarted at once",
			append(admitted(0, 10, limit, time.Millisecond), admitted(100*time.Millisecond, limit, limit, time.Millisecond)...), 1, 10, 1},
	} {
		x := checkExactness(c.answers, 1, limit)
		if x.windows != c.windows || x.over != c.over || x.twice != c.dup {
			t.Errorf("%s: checkExactness = %+v, want %d windows, %d over, %d with a remaining count twice", c.name, x, c.windows, c.over, c.dup)
		}
	}
}
