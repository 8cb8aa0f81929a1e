package overridemap

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// TestMapMatchesAGoMap applies seeded random sets and removals to a Map
// and to a Go map side by side, keeping every version of the Map: each
// must hold what the Go map held at its version (nothing written to an
// older snapshot), through splits into inner nodes and leaves emptied.
func TestMapMatchesAGoMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m := Build[int](maphash.MakeSeed(), nil, nil)
	want := map[Key]int{}
	type version struct {
		m    *Map[int]
		want map[Key]int
	}
	var versions []version
	for i := range 5000 {
		k := Key{Policy: fmt.Sprint("p", rng.IntN(3)), Subject: fmt.Sprint("s", rng.IntN(700))}
		if rng.IntN(3) == 0 {
			m = m.Without(k)
			delete(want, k)
		} else {
			m = m.With(k, i)
			want[k] = i
		}
		if i%500 == 0 {
			cp := make(map[Key]int, len(want))
			for k, v := range want {
				cp[k] = v
			}
			versions = append(versions, version{m, cp})
		}
	}
	versions = append(versions, version{m, want})
	for n, v := range versions {
		if v.m.Len() != len(v.want) {
			t.Fatalf("version %d: Len() = %d, want %d", n, v.m.Len(), len(v.want))
		}
		seen := 0
		v.m.Range(func(k Key, got int) {
			seen++
			if w, ok := v.want[k]; !ok || w != got {
				t.Errorf("version %d: Range gives %v = %d, want %d (present %v)", n, k, got, w, ok)
			}
		})
		if seen != len(v.want) {
			t.Errorf("version %d: Range gave %d keys, want %d", n, seen, len(v.want))
		}
		for k, w := range v.want {
			if got, ok := v.m.Get(k); !ok || got != w {
				t.Errorf("version %d: Get(%v) = %d, %v, want %d, true", n, k, got, ok, w)
			}
		}
		if _, ok := v.m.Get(Key{Policy: "p0", Subject: "absent"}); ok {
			t.Errorf("version %d: Get of a key never set found one", n)
		}
	}
	keys, vals := []Key{{"a", "1"}, {"a", "2"}, {"a", "1"}}, []int{1, 2, 3}
	if b := Build(maphash.MakeSeed(), keys, vals); b.Len() != 2 {
		t.Errorf("Build of a repeated key: Len() = %d, want 2", b.Len())
	} else if v, _ := b.Get(Key{"a", "1"}); v != 3 {
		t.Errorf("Build of a repeated key: Get = %d, want 3, the last", v)
	}
}
