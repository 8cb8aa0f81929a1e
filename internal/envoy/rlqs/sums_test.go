package rlqs

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestKeptSumsAreTheHolds: what the service keeps as holds change (each
// bucket's settled sums and fresh holds, each domain's streams by
// period) equals what walking the holds and streams gives, after every
// step of streams joining, reporting (new buckets, idle ones abandoned,
// periods changing), rounds and streams leaving.
func TestKeptSumsAreTheHolds(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 49))
	h := newHarness(t, testConfig(), Options{})
	var cs []*client
	for step := range 300 {
		switch k := rng.IntN(10); {
		case k < 2 && len(cs) < 6 || len(cs) == 0:
			cs = append(cs, h.client("edge"))
		case k < 3 && len(cs) > 1:
			i := rng.IntN(len(cs))
			if err := cs[i].s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			<-h.left
			cs = append(cs[:i], cs[i+1:]...)
		case k < 8:
			var us []usage
			for j := range rng.IntN(5) + 1 {
				us = append(us, usage{id: map[string]string{"tenant": fmt.Sprint(rng.IntN(8) + j), "route": "api"},
					allowed: uint64(rng.IntN(3) * rng.IntN(50)), elapsed: time.Duration(rng.IntN(70)) * time.Second})
			}
			cs[rng.IntN(len(cs))].report(us...)
		default:
			h.round()
		}
		checkSums(t, h.svc, fmt.Sprintf("seed %d step %d", seed, step))
	}
}

func checkSums(t *testing.T, s *Service, at string) {
	t.Helper()
	d := s.domains["edge"]
	d.mu.Lock()
	defer d.mu.Unlock()
	want := ttl(0)
	for st := range d.streams {
		want = max(want, st.ttl())
	}
	if got := d.maxTTL(); got != want {
		t.Fatalf("%s: maxTTL %v, the streams' %v", at, got, want)
	}
	for _, b := range d.buckets {
		var sum settled
		fresh := 0
		for st, h := range b.holds {
			if h.fresh {
				fresh++
				if b.fresh[st] != h {
					t.Fatalf("%s: a fresh hold is not among the bucket's fresh", at)
				}
			} else {
				sum.add(&h.hold)
			}
		}
		if sum != b.settled || fresh != len(b.fresh) {
			t.Fatalf("%s: kept %+v and %d fresh, the holds %+v and %d", at, b.settled, len(b.fresh), sum, fresh)
		}
	}
}
