package overridemap

import (
	"fmt"
	"hash/maphash"
	"testing"
)

// BenchmarkGet is a Check's lookup of a subject's override among 10 000,
// in a Map and, beside it as its floor, in a Go map of the same keys.
func BenchmarkGet(b *testing.B) {
	var keys []Key
	var vals []int
	for i := range 10000 {
		keys = append(keys, Key{"api", fmt.Sprintf("tenant-%d-xxxxxxxxxxxxxxxxxxxxxxxx", i)})
		vals = append(vals, i)
	}
	m := Build(maphash.MakeSeed(), keys, vals)
	gm := map[Key]int{}
	for i, k := range keys {
		gm[k] = vals[i]
	}
	b.Run("trie", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			m.Get(keys[i%len(keys)])
		}
	})
	b.Run("gomap", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			_ = gm[keys[i%len(keys)]]
		}
	})
}
