package sluice

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestKeySafeAgreesWithTheRule: keySafe, eight bytes at a time, answers
// exactly what checking subjectByte byte by byte answers, for
// every byte value at every position of subjects of every length up to
// 40, and for random subjects up to maxSubject.
func TestKeySafeAgreesWithTheRule(t *testing.T) {
	rule := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if !subjectByte(s[i]) {
				return false
			}
		}
		return true
	}
	check := func(s string) {
		t.Helper()
		if got, want := keySafe(s), rule(s); got != want {
			t.Fatalf("keySafe(%q) = %v, want %v", s, got, want)
		}
	}
	for n := 1; n <= 40; n++ {
		for i := range n {
			for c := range 256 {
				b := []byte(strings.Repeat("a", n))
				b[i] = byte(c)
				check(string(b))
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		b := make([]byte, 1+rng.IntN(maxSubject))
		for i := range b {
			b[i] = byte('!' + rng.IntN('~'-'!'+1))
		}
		if rng.IntN(2) == 0 {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
		check(string(b))
	}
}
