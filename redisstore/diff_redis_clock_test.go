package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/redisstore"
)

// The differential test's Redis-clock mode: the store on Redis time (the
// default), where a fixed window keeps its count and end only
// (algorithm.FixedWindowEnd, its key expiring at that end), against the Go
// engine fed the time the script decided at, which the script answers with
// its reply. Redis's clock only moves forward here, so the windows are
// short (1 to 10 ms): the sequences cross many of them.

// engineTwin is the Go twin of a store on Redis time: the engine's
// Evaluate over states kept as a store keeps them (an admitted write
// applied, a state that equals absent dropped), a fixed window as
// KindFixedWindowEnd.
type engineTwin struct {
	states map[string]*algorithm.State
}

// evaluate decides ev at now as redisstore on Redis time does, and
// returns its statuses.
func (e *engineTwin) evaluate(ev *sluice.Evaluation, now int64) ([]sluice.Status, error) {
	n := len(ev.Policies)
	hold, err := evaluation.Hold(ev.Hold)
	if err != nil {
		return nil, err
	}
	a := algorithm.Evaluation{Now: now, Op: evaluation.Op(ev), Cost: ev.Cost, LeaseID: ev.LeaseID, Hold: hold, MaxRegression: -1,
		Decisions: make([]algorithm.Decision, n), Writes: make([]algorithm.Write, n)}
	keys := make([]string, n)
	for i, p := range ev.Policies {
		ap := evaluation.Policy(p)
		ap.Params.Reserve = int32(evaluation.Reserve(p, ev.Priority, a.Op))
		if ap.Kind == algorithm.KindFixedWindow {
			ap.Kind = algorithm.KindFixedWindowEnd
		}
		keys[i] = fmt.Sprintf("%s/%s/%d/%t/%d", ev.Subject, p.ID, p.Revision, p.ClockAligned, ap.Kind)
		a.Policies, a.States = append(a.Policies, ap), append(a.States, e.states[keys[i]])
	}
	if err := algorithm.Check(a.Op, a.Policies, a.Cost, a.Hold, a.LeaseID, false); err != nil {
		return nil, err
	}
	if err := algorithm.Evaluate(&a); err != nil {
		return nil, err
	}
	if a.Commit {
		for i, k := range keys {
			w := &a.Writes[i]
			if w.Expires <= now {
				delete(e.states, k)
				continue
			}
			st := e.states[k]
			if st == nil {
				st = new(algorithm.State)
				e.states[k] = st
			}
			st.Apply(w)
		}
	}
	out := make([]sluice.Status, n)
	for i, p := range ev.Policies {
		evaluation.SetStatus(&out[i], p, &a.Decisions[i])
	}
	return out, nil
}

// shortWindow makes p's window one of 1 to 10 ms, and its other numbers
// valid for it.
func shortWindow(r *rand.Rand, p *sluice.Policy) *sluice.Policy {
	for {
		q := *p
		q.Window = []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond,
			time.Duration(1000+r.Int64N(9_000)) * time.Microsecond}[r.IntN(5)]
		q.Limit = min(q.Limit, 1000)
		q.Burst, q.MaxCost = 0, 0
		if q.Algorithm == sluice.TokenBucket || q.Algorithm == sluice.GCRA {
			// At least the burst p's classes need: a burst drawn below it
			// would fail every draw, and this loop would never end.
			q.Burst = max(1+r.Int64N(2*q.Limit), leastCapacity(q.Priorities))
		}
		if q.Validate() == nil {
			q = evaluation.Defaults(q)
			return &q
		}
	}
}

// leastCapacity returns the least capacity that leaves each class of
// shares at least one unit (algorithm.CheckShares's rule).
func leastCapacity(shares map[string]int) int64 {
	var least int64
	for _, share := range shares {
		least = max(least, int64((100+share-1)/share))
	}
	return least
}

// diffRedisClock drives algs' random sequences (several policies at once
// when multi is set) through a store on Redis time and its engine twin,
// demanding identical statuses over steps decisions; general sends every
// decision in the general form, and batched every decision in a decideAll
// call of its own (batch.lua: a short one by its spec, with a compact
// reply).
func diffRedisClock(t *testing.T, c redis.UniversalClient, seed uint64, algs []sluice.Algorithm, general, batched, multi bool, steps int) {
	// A TTL grace of an hour, as the caller-clock mode's: numbers changed
	// under one revision may lengthen a window past a key's TTL, which
	// the engine twin does not model. (A fixed window's key takes none:
	// it expires at the end it keeps.)
	var at int64
	s := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{ExtraTTL: time.Hour}), Batched: batched, OnRedisTime: func(now int64) { at = now }}
	twin := &engineTwin{states: map[string]*algorithm.State{}}
	r := rand.New(rand.NewPCG(seed, uint64(len(algs))<<8|boolBit(batched)<<2|boolBit(general)<<1|boolBit(multi)))
	const episode = 300
	var ps []*sluice.Policy
	subj := ""
	var allowed, denied, rolled int
	for step := range steps {
		if step%episode == 0 || r.IntN(40) == 0 {
			ps = ps[:0]
			for i := range 1 + boolInt(multi)*r.IntN(3) {
				ps = append(ps, shortWindow(r, randomPolicy(r, fmt.Sprint("p", i), algs[r.IntN(len(algs))])))
			}
			if step%episode == 0 {
				subj = fmt.Sprintf("%s.%d.%d", subject(t), seed, step)
			}
		}
		class := randomClass(r)
		cost := classCost(ps, class, randomCost(r, ps[0]))
		refund := cost > 0 && r.IntN(8) == 0
		for _, p := range ps {
			refund = refund && p.Algorithm != sluice.SlidingWindow
		}
		var hold time.Duration
		if !refund && cost > 0 && len(ps) == 1 && r.IntN(4) == 0 {
			hold = randomHold(r, ps[0])
		}
		op := sluice.Spend
		switch {
		case refund:
			op = sluice.Refund
		case cost == 0:
			op = sluice.Peek
		}
		got := &sluice.Evaluation{Op: op, Subject: subj, Policies: ps, Cost: cost, Hold: hold, Priority: class}
		before := at
		if err := s.Evaluate(context.Background(), formed(got, general)); err != nil {
			t.Fatalf("seed %d step %d: redisstore Evaluate(op=%v, cost=%d, hold=%v) on %s: %v", seed, step, op, cost, hold, describe(ps), err)
		}
		if at == before {
			t.Fatalf("seed %d step %d: the reply on Redis time carried no time", seed, step)
		}
		want, err := twin.evaluate(got, at)
		if err != nil {
			t.Fatalf("seed %d step %d: engine at %d: %v", seed, step, at, err)
		}
		if !slices.Equal(got.Statuses, want) {
			t.Fatalf("seed %d step %d: policies %s at %d (Redis time): Evaluate(op=%v, cost=%d, hold=%v) = %+v, the engine says %+v", seed, step, describe(ps), at, op, cost, hold, got.Statuses, want)
		}
		if got.Statuses[0].Allowed {
			allowed++
		} else {
			denied++
		}
		if before != 0 && at-before >= ps[0].Window.Microseconds() {
			rolled++
		}
	}
	t.Logf("%d steps on Redis time: %d allowed, %d denied, %d a window or more after the one before", steps, allowed, denied, rolled)
}

func boolBit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func boolInt(b bool) int { return int(boolBit(b)) }

// diffRedisClockLeases drives random acquisitions, releases, renewals and
// peeks of a few leases under a concurrency policy with a short lease TTL
// (1 to 10 ms, so that leases expire between steps on Redis's clock)
// through a store on Redis time and its engine twin, demanding identical
// statuses over steps decisions: alone (an acquire or a release in the
// short form, short.lua's leaseFloor), batched (by a lease's spec in a
// decideAll call) or general. Limits of 1 to 3 and three lease ids keep
// the states a pair meets (no lease, the only one, named or not) common.
func diffRedisClockLeases(t *testing.T, c redis.UniversalClient, seed uint64, general, batched bool, steps int) {
	var at int64
	s := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{ExtraTTL: time.Hour}), Batched: batched, OnRedisTime: func(now int64) { at = now }}
	twin := &engineTwin{states: map[string]*algorithm.State{}}
	r := rand.New(rand.NewPCG(seed, 79<<8|boolBit(batched)<<2|boolBit(general)<<1))
	const episode = 300
	var p *sluice.Policy
	subj := ""
	var allowed, denied int
	for step := range steps {
		if step%episode == 0 || r.IntN(60) == 0 {
			q := evaluation.Defaults(sluice.Policy{ID: "diff", Algorithm: sluice.Concurrency, Limit: 1 + r.Int64N(3),
				LeaseTTL: time.Duration(1000+r.Int64N(9_000)) * time.Microsecond, Priorities: randomShares(r)})
			p = &q
			if step%episode == 0 {
				subj = fmt.Sprintf("%s.%d.%d", subject(t), seed, step)
			}
		}
		ev := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, LeaseID: fmt.Sprint("lease-", r.IntN(3)), Priority: randomClass(r)}
		switch r.IntN(10) {
		case 0, 1, 2, 3:
			ev.Op, ev.Cost = sluice.Acquire, 1
		case 4, 5, 6, 7:
			ev.Op, ev.Priority = sluice.Release, "" // a release takes no class
		case 8:
			ev.Op = sluice.Renew
		default:
			ev.Op, ev.LeaseID = sluice.Peek, ""
		}
		before := at
		if err := s.Evaluate(context.Background(), formed(ev, general)); err != nil {
			t.Fatalf("seed %d step %d: redisstore %v %s on %s: %v", seed, step, ev.Op, ev.LeaseID, describeLeases(ev.Policies), err)
		}
		if at == before {
			t.Fatalf("seed %d step %d: the reply on Redis time carried no time", seed, step)
		}
		want, err := twin.evaluate(ev, at)
		if err != nil {
			t.Fatalf("seed %d step %d: engine at %d: %v", seed, step, at, err)
		}
		if !slices.Equal(ev.Statuses, want) {
			t.Fatalf("seed %d step %d: policies %s at %d (Redis time): %v %s = %+v, the engine says %+v", seed, step, describeLeases(ev.Policies), at, ev.Op, ev.LeaseID, ev.Statuses, want)
		}
		if ev.Statuses[0].Allowed {
			allowed++
		} else {
			denied++
		}
	}
	t.Logf("%d lease steps on Redis time: %d allowed, %d denied", steps, allowed, denied)
}
