package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// settleAlgorithms are the algorithms an estimate may name.
var settleAlgorithms = []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.TokenBucket, sluice.GCRA}

// settlePeriod, among diffSettle's algorithms, draws a fixed_window with
// a calendar period (randomPeriodPolicy).
const settlePeriod = sluice.Algorithm(255)

// settlePolicy draws a policy of a that takes estimates: randomPolicy's,
// the bucket algorithms' burst small enough to carry a full bucket of
// debt exactly (algorithm's checkSettle), and a DedupeTTL (the estimate's
// deadline) from 2s to a minute, so some estimates are forgotten before
// they are settled.
func settlePolicy(t *testing.T, r *rand.Rand, id string, a sluice.Algorithm) *sluice.Policy {
	for {
		var p *sluice.Policy
		if a == settlePeriod {
			p = randomPeriodPolicy(t, r, id)
		} else {
			p = randomPolicy(r, id, a)
		}
		if (a == sluice.TokenBucket || a == sluice.GCRA) && p.Burst > (1<<53-1-p.Limit)/(2*p.Window.Microseconds()) {
			continue
		}
		// Redis expires the id keys on its own clock (TTL plus grace after
		// the last record): 2s and more outlast an episode on a loaded
		// machine, while the fake clock passes them often.
		ttls := []time.Duration{2 * time.Second, 10 * time.Second, time.Minute}
		p.DedupeTTL = ttls[r.IntN(len(ttls))]
		// Room for every id of an episode: beyond DedupeMax, memstore
		// forgets the oldest recorded and the script the soonest to
		// expire, which differ once the clock has stepped back.
		p.DedupeMax = 10_000
		return p
	}
}

// diffSettle drives random sequences of estimates and settles, with
// spends, peeks and refunds between them, through memstore and the script
// on one fake clock, as TestDifferential does for the other operations:
// settles of estimates still live, forgotten (past their deadline),
// denied or never made, actual costs below, at and above the estimate
// (past the limit), retried settles and estimates, which must answer
// the same, and settles naming other policies than their estimate's (one
// swapped for another, one more or one fewer, the first two swapped: the
// hostile caller's settle, refused by both, giving nothing back). Every
// status (its Charged, GivenBack and Owed included), Replayed flag and
// error class must agree.
func diffSettle(t *testing.T, c redis.UniversalClient, seed uint64, algs []sluice.Algorithm, general bool, steps int) {
	d := newDiff(t, c)
	d.general = general
	r := rand.New(rand.NewPCG(seed, uint64(len(algs))*7+uint64(algs[0])))
	const episode = 300
	var ps []*sluice.Policy
	var other *sluice.Policy // a policy no estimate of the episode names
	var ids []string         // estimates spent this episode, settled or not
	var settled, charged, given, refused, named int
	defer func() {
		t.Logf("%d steps: %d settles (%d charged past the estimate, %d given back), %d refused, %d naming other policies", steps, settled, charged, given, refused, named)
	}()
	for step := range steps {
		if step%episode == 0 {
			ps, ids = nil, nil
			for i := range 1 + r.IntN(len(algs)) {
				ps = append(ps, settlePolicy(t, r, fmt.Sprint("p", i), algs[r.IntN(len(algs))]))
			}
			other = settlePolicy(t, r, "q", algs[r.IntN(len(algs))])
			d.newSubject(r, seed, step)
		}
		most := ps[0].MaxCost
		for _, p := range ps {
			most = min(most, p.MaxCost)
		}
		// Forward only: once the clock has stepped back, memstore's id log
		// (which forgets expired ids from its oldest on, up to the first
		// live one) and the script's (every expired id) differ on ids a
		// later step finds live again, for every operation with an id.
		w := span(ps[0])
		if ps[0].Period != "" {
			// Steps of up to a week would forget nearly every estimate
			// (deadlines of a minute at most): steps of a twentieth of a
			// deadline keep an episode's estimates live for dozens of
			// steps, and still cross minutes' boundaries.
			w = min(w, ps[0].DedupeTTL.Microseconds()/20)
		}
		d.now += max(randomStep(r, w), 0)
		d.clock.Set(time.UnixMicro(d.now))
		ev := sluice.Evaluation{Subject: d.subject, Policies: ps}
		switch k := r.IntN(10); {
		case k < 4 || len(ids) == 0:
			ev.Op, ev.Cost = sluice.Estimate, 1+r.Int64N(min(most, 1+r.Int64N(1000)))
			ev.EvaluationID = fmt.Sprint("id", step)
			if r.IntN(10) == 0 && len(ids) > 0 {
				ev.EvaluationID = ids[r.IntN(len(ids))] // a retried estimate
			} else {
				ids = append(ids, ev.EvaluationID)
			}
		case k < 8:
			ev.Op, ev.EvaluationID = sluice.Settle, ids[r.IntN(len(ids))]
			switch r.IntN(4) {
			case 0:
				ev.Cost = 0
			case 1:
				ev.Cost = r.Int64N(most + 1)
			default:
				ev.Cost = r.Int64N(3*most + 1) // often past the estimate, and the limit
			}
			if r.IntN(20) == 0 {
				ev.EvaluationID = "never" // a settle with no estimate
			}
			if r.IntN(8) == 0 {
				ev.Policies = strangers(r, ps, other)
				named++
			}
		case k == 8:
			ev.Op, ev.Cost = sluice.Spend, 1+r.Int64N(min(most, 5))
		default:
			ev.Op, ev.Cost = sluice.Refund, 1+r.Int64N(min(most, 5))
		}
		st := d.evaluateBoth(seed, step, &ev)
		if ev.Op == sluice.Settle && st != nil {
			settled++
			for _, s := range st {
				if s.Charged > 0 {
					charged++
				}
				if s.GivenBack > 0 {
					given++
				}
			}
		} else if st == nil {
			refused++
		}
	}
}

// strangers returns policies a settle of an estimate on ps may not name:
// other swapped in for one of ps (the first kept, so the settle finds the
// estimate), other added, the last of ps dropped, or the first two
// swapped.
func strangers(r *rand.Rand, ps []*sluice.Policy, other *sluice.Policy) []*sluice.Policy {
	out := slices.Clone(ps)
	switch k := r.IntN(4); {
	case k == 0 && len(ps) > 1:
		out[1+r.IntN(len(ps)-1)] = other
	case k == 1 && len(ps) > 1:
		out = out[:len(ps)-1]
	case k == 2 && len(ps) > 1:
		out[0], out[1] = out[1], out[0]
	default:
		out = append(out, other)
	}
	return out
}

// evaluateBoth takes ev on both stores and demands the same answer: the
// same statuses and Replayed flag, or errors of the same kind. It returns
// the statuses, nil on an error.
func (d *diff) evaluateBoth(seed uint64, step int, ev *sluice.Evaluation) []sluice.Status {
	d.t.Helper()
	want, got := *ev, *ev
	werr := d.mem.Evaluate(context.Background(), &want)
	gerr := d.redis.Evaluate(context.Background(), formed(&got, d.general))
	what := fmt.Sprintf("seed %d step %d: policies %s now=%d: %v(cost=%d, id=%s)", seed, step, describe(ev.Policies), d.now, ev.Op, ev.Cost, ev.EvaluationID)
	if werr != nil || gerr != nil {
		for _, kind := range []error{sluice.ErrInvalidRequest, algorithm.ErrCostTooHigh, algorithm.ErrNotRefundable, sluice.CorruptState, sluice.ClockUnsafe} {
			if errors.Is(werr, kind) != errors.Is(gerr, kind) {
				d.t.Fatalf("%s: redisstore says %v, memstore says %v", what, gerr, werr)
			}
		}
		if (werr == nil) != (gerr == nil) {
			d.t.Fatalf("%s: redisstore says %v, memstore says %v", what, gerr, werr)
		}
		return nil
	}
	if !slices.Equal(got.Statuses, want.Statuses) || got.Replayed != want.Replayed {
		d.t.Fatalf("%s = %+v (replayed %v), memstore says %+v (replayed %v)", what, got.Statuses, got.Replayed, want.Statuses, want.Replayed)
	}
	return got.Statuses
}

// TestDifferentialSettleRetry pins the promise a retried settle keeps on
// both stores: the same answer, Replayed, and nothing changed.
func TestDifferentialSettleRetry(t *testing.T) {
	d := newDiff(t, standaloneClient(t))
	for _, a := range settleAlgorithms {
		p := &sluice.Policy{ID: "p", Algorithm: a, Limit: 10, Window: time.Minute, DedupeTTL: time.Minute}
		*p = evaluation.Defaults(*p)
		ps := []*sluice.Policy{p}
		d.subject, d.now = subject(t)+"."+a.String(), sluicetest0
		d.clock.Set(time.UnixMicro(d.now))
		d.evaluateBoth(0, 0, &sluice.Evaluation{Op: sluice.Estimate, Subject: d.subject, Policies: ps, Cost: 4, EvaluationID: "x"})
		first := d.evaluateBoth(0, 1, &sluice.Evaluation{Op: sluice.Settle, Subject: d.subject, Policies: ps, Cost: 13, EvaluationID: "x"})
		if first == nil || first[0].Charged != 9 || first[0].Owed != 3 {
			t.Fatalf("%v: settle 4 → 13 with 6 left = %+v, want Charged 9, Owed 3", a, first)
		}
		retry := sluice.Evaluation{Op: sluice.Settle, Subject: d.subject, Policies: ps, Cost: 1, EvaluationID: "x"}
		again := d.evaluateBoth(0, 2, &retry)
		if !slices.Equal(again, first) {
			t.Fatalf("%v: retried settle = %+v, want the first answer %+v", a, again, first)
		}
		peek := d.evaluateBoth(0, 3, &sluice.Evaluation{Op: sluice.Peek, Subject: d.subject, Policies: ps})
		if peek[0].Remaining != 0 || peek[0].Allowed {
			t.Fatalf("%v: after a settle 3 past the limit, peek = %+v, want denied with nothing left", a, peek[0])
		}
	}
}
