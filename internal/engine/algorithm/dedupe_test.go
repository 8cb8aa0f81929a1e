package algorithm

import (
	"fmt"
	"slices"
	"testing"
)

// TestDedupeLogGrowsAndShrinks: a log finds each of its ids whether it
// scans (a few ids) or keeps an index (past indexFrom), across pruning
// from the front and removal from the middle.
func TestDedupeLogGrowsAndShrinks(t *testing.T) {
	l := &DedupeLog{}
	const n = 3*indexFrom + 1
	for i := range n {
		l.add(dedupeRecord{id: fmt.Sprint("id-", i), expires: int64(i + 1)})
	}
	find := func(when string, live ...int) {
		t.Helper()
		for i := range n {
			r, ok := l.get(fmt.Sprint("id-", i))
			want := slices.Contains(live, i)
			if ok != want || ok && r.expires != int64(i+1) {
				t.Fatalf("%s: get(id-%d) = %+v, %v; want found %v", when, i, r, ok, want)
			}
		}
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	find("filled", all...)
	if l.index == nil {
		t.Fatalf("a log of %d ids keeps no index", n)
	}
	if got := l.Prune(5, n); got != 5 {
		t.Fatalf("prune at 5 forgot %d, want 5", got)
	}
	find("after the first 5 expired", all[5:]...)
	l.remove("id-10")
	find("after id-10 was removed", slices.Concat(all[5:10], all[11:])...)
	if got := l.Prune(int64(n-2), n); got != n-2-5-1 {
		t.Fatalf("prune at %d forgot %d, want %d", n-2, got, n-2-5-1)
	}
	find("down to 2", n-2, n-1)
	if l.index != nil {
		t.Fatalf("a log of %d ids still keeps an index", len(l.order))
	}
	l.add(dedupeRecord{id: "id-0", expires: 1})
	find("with id-0 again", 0, n-2, n-1)
}

// TestDedupeLogRemembers: an id's decisions are found until they expire,
// a copy of what was remembered; beyond max ids the oldest go; an expired
// id remembered again is recorded anew; Remember reports how the log grew.
func TestDedupeLogRemembers(t *testing.T) {
	var l DedupeLog
	ds := []Decision{{Allowed: true, Limit: 5, Remaining: 4}}
	if got := l.Remember("a", 100, 50, 2, ds); got != 1 {
		t.Fatalf("Remember(a) grew the log by %d, want 1", got)
	}
	ds[0].Remaining = 0 // the log keeps its own copy
	if got := l.Lookup("a", 149); len(got) != 1 || got[0].Remaining != 4 {
		t.Fatalf("Lookup(a) at 149 = %+v, want the remembered decision", got)
	}
	if got := l.Lookup("a", 150); got != nil {
		t.Fatalf("Lookup(a) at its expiry = %+v, want nil", got)
	}
	l.Remember("b", 110, 100, 2, ds)
	if got := l.Remember("c", 120, 100, 2, ds); got != 0 {
		t.Fatalf("Remember(c) beyond max 2 grew the log by %d, want 0 (a forgotten)", got)
	}
	if l.Lookup("a", 120) != nil || l.Lookup("b", 120) == nil || l.Lookup("c", 120) == nil || l.Len() != 2 {
		t.Fatalf("after c: a %v, b %v, c %v, %d records; want b and c only",
			l.Lookup("a", 120), l.Lookup("b", 120), l.Lookup("c", 120), l.Len())
	}
	if got := l.Remember("b", 215, 100, 2, ds); got != 0 || l.Len() != 2 || l.Newest() != 315 {
		t.Fatalf("b again once expired: grew %d, %d records, newest %d; want 0, 2, 315", got, l.Len(), l.Newest())
	}
}
