package sluice_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestFastPathEqual: random requests, most of the shape the fast path
// takes (a spend or a peek of one policy), some malformed, through a
// Limiter and through one that validates every request the general way,
// each on a memstore of its own on one fake clock, get identical outcomes.
func TestFastPathEqual(t *testing.T) {
	clock := sluicetest.NewClock()
	policies := []sluice.Policy{
		{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Second},
		{ID: "gcra", Algorithm: sluice.GCRA, Limit: 10, Window: time.Second, Burst: 3},
		{ID: "log", Algorithm: sluice.SlidingLog, Limit: 4, Window: time.Second, MaxCost: 3},
		{ID: "sw", Algorithm: sluice.SlidingWindow, Limit: 6, Window: time.Second},
		{ID: "near", Algorithm: sluice.TokenBucket, Limit: 3, Window: time.Second, NearCache: true},
	}
	opts := sluice.Options{Clock: clock, Overrides: []sluice.Override{{Policy: "fw", Subject: "s1", Limit: 2}, {Policy: "gcra", Subject: "s2", Limit: 20, Burst: 6}}}
	var lims [2]*sluice.Limiter
	for i := range lims {
		l, err := sluice.New(newMemstore(t, clock), policies, opts)
		if err != nil {
			t.Fatal(err)
		}
		lims[i] = l
	}
	sluice.GeneralPathOnly(lims[1])
	rng := rand.New(rand.NewPCG(1, 2))
	ids := []string{"fw", "gcra", "log", "sw", "near", "nope", ""}
	subjects := []string{"s0", "s1", "s2", "s3", "", "a b", "x{y}"}
	ctx := context.Background()
	for i := range 4000 {
		req := sluice.Request{Policy: ids[rng.IntN(len(ids))], Subject: subjects[rng.IntN(len(subjects))], Cost: int64(rng.IntN(6)) - 1}
		if rng.IntN(4) == 0 {
			req.Op = sluice.Peek
			if rng.IntN(3) > 0 {
				req.Cost = 0
			}
		}
		if rng.IntN(50) == 0 {
			req.Cost = 1 << 40
		}
		if rng.IntN(5) == 0 {
			clock.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		fast, general := lims[0].Check(ctx, req), lims[1].Check(ctx, req)
		if diff := cmp.Diff(describe(general), describe(fast)); diff != "" {
			t.Fatalf("request %d, Check(%+v): fast path differs from the general one (-general +fast):\n%s", i, req, diff)
		}
	}
}

// describe returns o with Err as its text, for cmp.
func describe(o sluice.Outcome) any {
	err := ""
	if o.Err != nil {
		err = o.Err.Error()
	}
	o.Err = nil
	return struct {
		O   sluice.Outcome
		Err string
	}{o, err}
}
