package algorithm

import "testing"

// TestLive: a state is live until the instant it equals absent (Expires),
// and an absent one never is.
func TestLive(t *testing.T) {
	p := Policy{Kind: KindFixedWindow, Params: Params{Limit: 5, Window: 1000}}
	var st State
	var w Write
	var d Decision
	p.step(&absent, 100, OpSpend, 1, 0, "", &w, &d)
	st.Apply(&w)
	exp := p.Expires(&st)
	if exp <= 100 {
		t.Fatalf("Expires = %d after a spend at 100, want after it", exp)
	}
	for _, c := range []struct {
		st   *State
		now  int64
		want bool
	}{{nil, 100, false}, {&st, 100, true}, {&st, exp - 1, true}, {&st, exp, false}} {
		if got := p.Live(c.st, c.now); got != c.want {
			t.Errorf("Live(%v, %d) = %v, want %v", c.st != nil, c.now, got, c.want)
		}
	}
}
