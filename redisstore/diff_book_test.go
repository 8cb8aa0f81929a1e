package redisstore_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// diffBook drives random sequences of bookings (sluice.Book) on one
// policy of a, gcra or token_bucket, with spends, peeks and refunds
// between them, through memstore and the script on one fake clock, as
// TestDifferential does for the other operations: bookings admitted now,
// booked ahead (their Delay), and denied past their most wait (0 to
// three windows, at most algorithm.MostWait), with the clock stepping
// back and the policy's numbers (its window too) changed under one
// revision. Every status, its Delay included, must agree; batched sends
// every decision through a decideAll call (batch.lua), as decisions that
// meet busy senders go.
func diffBook(t *testing.T, c redis.UniversalClient, seed uint64, a sluice.Algorithm, batched bool, steps int) {
	d := newDiff(t, c)
	d.redis.Batched = batched
	r := rand.New(rand.NewPCG(seed, 1000+uint64(a)))
	const episode = 300
	var ps []*sluice.Policy
	var booked, ahead, denied int
	defer func() {
		t.Logf("%d steps: %d bookings admitted, %d of them booked ahead, %d denied", steps, booked, ahead, denied)
	}()
	for step := range steps {
		switch {
		case step%episode == 0:
			ps = []*sluice.Policy{randomPolicy(r, "diff", a)}
			d.newSubject(r, seed, step)
		case r.IntN(20) == 0:
			ps[0] = randomPolicy(r, "diff", a)
		}
		p := ps[0]
		w := p.Window.Microseconds()
		d.now = max(d.now+randomStep(r, w/4), 1)
		d.clock.Set(time.UnixMicro(d.now))
		class := randomClass(r) // a sheddable booking keeps out of the reserve as a spend does
		ev := sluice.Evaluation{Op: sluice.Book, Subject: d.subject, Policies: ps, Priority: class, Cost: classCost(ps, class, 1+r.Int64N(min(p.MaxCost, 5)))}
		switch r.IntN(6) {
		case 0:
			ev.Op, ev.Cost = sluice.Spend, classCost(ps, class, randomCost(r, p))
			if ev.Cost == 0 {
				ev.Op = sluice.Peek
			}
		case 1:
			ev.Op = sluice.Refund
		default:
			most := min(algorithm.MostWait(evaluation.Policy(p).Params), 3*w)
			ev.MaxWait = time.Duration(r.Int64N(most+1)) * time.Microsecond
		}
		want, got := ev, ev
		errM := d.mem.Evaluate(context.Background(), &want)
		errR := d.redis.Evaluate(context.Background(), formed(&got, d.general))
		if errM != nil || errR != nil {
			t.Fatalf("seed %d step %d: %v cost=%d max wait=%v: memstore %v, redisstore %v", seed, step, ev.Op, ev.Cost, ev.MaxWait, errM, errR)
		}
		if !slices.Equal(got.Statuses, want.Statuses) {
			t.Fatalf("seed %d step %d: policies %s now=%d: %v cost=%d max wait=%v = %+v, memstore says %+v", seed, step, describe(ps), d.now, ev.Op, ev.Cost, ev.MaxWait, got.Statuses, want.Statuses)
		}
		if ev.Op == sluice.Book {
			switch st := got.Statuses[0]; {
			case !st.Allowed:
				denied++
			case st.Delay > 0:
				booked, ahead = booked+1, ahead+1
			default:
				booked++
			}
		}
	}
}
