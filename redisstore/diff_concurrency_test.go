package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// randomLeasePolicy draws valid concurrency numbers, favouring edge
// cases: a limit of 1, a 1ms lease TTL, a 24h one.
func randomLeasePolicy(r *rand.Rand, id string) *sluice.Policy {
	ttls := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 10 * time.Second, time.Minute, 24 * time.Hour}
	limits := []int64{1, 2, 3, 5, 10, 100}
	p := sluice.Policy{ID: id, Algorithm: sluice.Concurrency, Limit: limits[r.IntN(len(limits))], LeaseTTL: ttls[r.IntN(len(ttls))]}
	if r.IntN(4) == 0 {
		p.LeaseTTL = time.Duration(1000+r.Int64N(86_400_000_000-1000)) * time.Microsecond
	}
	if p.Priorities = randomShares(r); p.Validate() != nil {
		p.Priorities = map[string]int{"critical": 100, "sheddable": 100} // a share that leaves a limit this low no lease
	}
	if err := p.Validate(); err != nil {
		panic(err)
	}
	p = evaluation.Defaults(p)
	return &p
}

// leaseOp is one operation of the concurrency differential.
type leaseOp struct {
	op    sluice.Op
	cost  int64
	lease string
}

func (o leaseOp) String() string {
	if o.op == sluice.Acquire {
		return fmt.Sprintf("acquire %s (cost %d)", o.lease, o.cost)
	}
	return fmt.Sprint(o.op, " ", o.lease)
}

// randomLeaseOp draws an acquisition (of a lease from a small pool, so
// ids repeat: a held one is renewed), a release (often of a lease not
// held, or expired), a renewal, or a peek.
func randomLeaseOp(r *rand.Rand) leaseOp {
	id := fmt.Sprint("lease-", r.IntN(12))
	switch r.IntN(10) {
	case 0, 1, 2, 3:
		return leaseOp{op: sluice.Acquire, cost: 1 + r.Int64N(3), lease: id}
	case 4, 5, 6:
		return leaseOp{op: sluice.Release, lease: id}
	case 7:
		return leaseOp{op: sluice.Renew, lease: id}
	}
	return leaseOp{op: sluice.Peek}
}

// leaseStep moves the clock by dt µs and runs op on both stores.
func (d *diff) leaseStep(seed uint64, step int, dt int64, op leaseOp, ps []*sluice.Policy) []sluice.Status {
	d.t.Helper()
	d.now = max(d.now+dt, 1)
	d.clock.Set(time.UnixMicro(d.now))
	evs := [2]*sluice.Evaluation{}
	for i := range evs {
		evs[i] = &sluice.Evaluation{Op: op.op, Subject: d.subject, Policies: ps, Cost: op.cost, LeaseID: op.lease, Priority: d.class}
	}
	if err := d.mem.Evaluate(context.Background(), evs[0]); err != nil {
		d.t.Fatalf("seed %d step %d: now=%d: memstore %v: %v", seed, step, d.now, op, err)
	}
	if err := d.redis.Evaluate(context.Background(), formed(evs[1], d.general)); err != nil {
		d.t.Fatalf("seed %d step %d: now=%d: redisstore %v: %v", seed, step, d.now, op, err)
	}
	if !slices.Equal(evs[1].Statuses, evs[0].Statuses) {
		d.t.Fatalf("seed %d step %d: policies %s now=%d: %v (class %q) = %+v, memstore says %+v", seed, step, describeLeases(ps), d.now, op, d.class, evs[1].Statuses, evs[0].Statuses)
	}
	return evs[1].Statuses
}

func describeLeases(ps []*sluice.Policy) string {
	s := describe(ps)
	for _, p := range ps {
		if p.Algorithm == sluice.Concurrency {
			s += fmt.Sprintf("[%s lease_ttl=%v]", p.ID, p.LeaseTTL)
		}
	}
	return s
}

// TestDifferentialConcurrency is TestDifferential for concurrency
// policies: random acquisitions, releases, renewals and peeks, with the
// clock stepping back now and then and the numbers changed under one
// revision, through memstore (the Go engine) and the Lua script, which
// must answer alike (alone: through the short form of an acquire or a
// release, and through the general form only, on one sequence), then on
// Redis time against the engine twin (short, batched and general); then
// concurrency beside rate policies in one decision.
func TestDifferentialConcurrency(t *testing.T) {
	seed := *diffSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -sluice.diffseed=%d)", seed, seed)
	c := standaloneClient(t)
	for _, general := range []bool{false, true} {
		name := "alone/short"
		if general {
			name = "alone/general"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := newDiff(t, c)
			d.general = general
			r := rand.New(rand.NewPCG(seed, 77))
			const episode = 300
			var ps []*sluice.Policy
			var allowed, denied, changes, onExpiry int
			type held struct {
				at    int64
				lease string
			}
			var acquired []held // leases acquired, for steps onto their exact expiry
			defer func() {
				t.Logf("%d steps: %d allowed, %d denied, %d onto a lease's exact expiry, %d policy changes under one revision", *diffSteps, allowed, denied, onExpiry, changes)
			}()
			for step := range *diffSteps {
				switch {
				case step%episode == 0:
					ps = []*sluice.Policy{randomLeasePolicy(r, "diff")}
					d.newSubject(r, seed, step)
				case r.IntN(50) == 0:
					ps[0] = randomLeasePolicy(r, "diff")
					changes++
				}
				ttl := ps[0].LeaseTTL.Microseconds()
				dt := randomStep(r, ttl)
				op := randomLeaseOp(r)
				d.class = randomClass(r)
				if len(acquired) > 0 && r.IntN(5) == 0 {
					// Onto the instant a lease expires (or 1µs either side),
					// often naming that lease: where < and <= part.
					h := acquired[r.IntN(len(acquired))]
					dt = h.at + ttl - d.now + r.Int64N(3) - 1
					if op.op == sluice.Acquire && r.IntN(2) == 0 {
						op.lease = h.lease
					}
					onExpiry++
				}
				if d.leaseStep(seed, step, dt, op, ps)[0].Allowed {
					allowed++
					if op.op == sluice.Acquire || op.op == sluice.Renew {
						acquired = append(acquired, held{d.now, op.lease})
					}
				} else {
					denied++
				}
				if step%episode == episode-1 || len(acquired) > 64 {
					acquired = acquired[:0]
				}
			}
		})
	}
	for _, form := range []string{"short", "general", "batched"} {
		t.Run("alone/redis-clock/"+form, func(t *testing.T) {
			t.Parallel()
			diffRedisClockLeases(t, c, seed, form == "general", form == "batched", *diffSteps)
		})
	}
	t.Run("with rate policies", func(t *testing.T) {
		t.Parallel()
		d := newDiff(t, c)
		r := rand.New(rand.NewPCG(seed, 78))
		const episode = 200
		var ps []*sluice.Policy
		for step := range *diffSteps / 5 {
			if step%episode == 0 {
				ps = []*sluice.Policy{randomLeasePolicy(r, "conc")}
				for i := range 1 + r.IntN(3) {
					ps = append(ps, randomPolicy(r, fmt.Sprint("p", i), algorithms[r.IntN(len(algorithms))]))
				}
				r.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
				d.newSubject(r, seed, step)
			}
			op := randomLeaseOp(r)
			if op.op == sluice.Release || op.op == sluice.Renew {
				op = leaseOp{op: sluice.Acquire, cost: 1, lease: op.lease} // a release names concurrency policies only
			}
			d.class = randomClass(r)
			op.cost = classCost(ps, d.class, op.cost)
			w := ps[0].Window
			if ps[0].Algorithm == sluice.Concurrency {
				w = ps[0].LeaseTTL
			}
			d.leaseStep(seed, step, randomStep(r, w.Microseconds()), op, ps)
		}
	})
}
