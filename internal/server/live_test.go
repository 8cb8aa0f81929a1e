package server

import (
	"testing"

	"github.com/sluicehq/sluice"
)

func TestLiveRing(t *testing.T) {
	l := newLive()
	const t0 = 1_700_000_000
	l.add("a", sluice.Allowed, t0)
	l.add("a", sluice.Allowed, t0)
	l.add("a", sluice.Denied, t0+1)
	l.add("a", sluice.Unavailable, t0+LiveSeconds) // the slot of t0, a lap later
	l.add("b", sluice.Kind(0), t0)                 // not an outcome: ignored
	s := l.series([]string{"a", "b"}, t0+LiveSeconds)
	a := s[0]
	last := LiveSeconds - 1
	if a.Counts["denied"][0] != 1 || a.Counts["unavailable"][last] != 1 || a.Total["allowed"] != 0 || a.Total["denied"] != 1 {
		t.Errorf("series of a = %+v, want t0 lapped out (its slot reused), t0+1 first, the unavailable last", a.Total)
	}
	if s[1].Policy != "b" || s[1].Total["allowed"] != 0 || len(s[1].Counts["allowed"]) != LiveSeconds {
		t.Errorf("series of b = %+v, want zero series", s[1])
	}
	// An older second never reads a newer slot's counts.
	if old := l.series([]string{"a"}, t0)[0]; old.Total["unavailable"] != 0 || old.Total["allowed"] != 0 {
		t.Errorf("series ending at t0 = %+v, want nothing: its slot holds t0+%d now", old.Total, LiveSeconds)
	}
	l.add(UnknownPolicy, sluice.Incompatible, t0)
	l.keep(map[string]bool{"b": true})
	if _, ok := l.rings["a"]; ok {
		t.Errorf("keep(b) kept a's ring")
	}
	if _, ok := l.rings[UnknownPolicy]; !ok {
		t.Errorf("keep(b) dropped the ring of unknown policies")
	}
}
