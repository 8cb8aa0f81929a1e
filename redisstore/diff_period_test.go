package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/redisstore"
)

// The differential test's calendar periods (fixed_window with a period,
// algorithm.FixedPeriod): in caller-clock mode memstore and the script
// compute the same bounds around one fake clock, moved by steps of up to
// a few periods either way (a step back past the periods around the clock
// is refused by both, as ClockUnsafe); on Redis time the store sends
// bounds drawn from a calendar of periods of a few ms around Redis's
// clock (Driven.Bounds) and the engine twin decides at the time the
// script answers, on the bounds sent.

// periodZones are the zones the periods are drawn in: UTC, two with DST
// changes at 2–3 am, one a half hour off UTC and one whose DST change is
// half an hour.
var periodZones = []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"}

// randomPeriodPolicy draws a fixed_window policy with a calendar period.
func randomPeriodPolicy(t *testing.T, r *rand.Rand, id string) *sluice.Policy {
	loc, err := time.LoadLocation(periodZones[r.IntN(len(periodZones))])
	if err != nil {
		t.Fatal(err)
	}
	limits := []int64{1, 2, 3, 5, 10, 100, 1000, 100_000}
	p := sluice.Policy{ID: id, Algorithm: sluice.FixedWindow, Limit: limits[r.IntN(len(limits))],
		Period: []string{"minute", "hour", "day", "week", "month", "year"}[r.IntN(6)], TimeZone: loc}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	p = evaluation.Defaults(p)
	return &p
}

// span is the length a random step is drawn against: p's window, or its
// period's nominal length.
func span(p *sluice.Policy) int64 {
	if p.Period == "" {
		return p.Window.Microseconds()
	}
	return map[string]int64{"minute": 60e6, "hour": 3600e6, "day": 86400e6, "week": 7 * 86400e6, "month": 31 * 86400e6, "year": 365 * 86400e6}[p.Period]
}

// stepPeriods moves the clock and evaluates on both stores as d.step
// does, except that a decision both stores refuse as ClockUnsafe (a
// period's state written further ahead than the periods around the
// clock) agrees too; it reports whether it was refused.
func (d *diff) stepPeriods(seed uint64, step int, dt, cost int64, refund bool, ps []*sluice.Policy) (allowed, refused bool) {
	d.t.Helper()
	d.now = max(d.now+dt, 1)
	d.clock.Set(time.UnixMicro(d.now))
	op := sluice.Spend
	switch {
	case refund:
		op = sluice.Refund
	case cost == 0:
		op = sluice.Peek
	}
	want := &sluice.Evaluation{Op: op, Subject: d.subject, Policies: ps, Cost: cost}
	got := &sluice.Evaluation{Op: op, Subject: d.subject, Policies: ps, Cost: cost}
	errM := d.mem.Evaluate(context.Background(), want)
	errR := d.redis.Evaluate(context.Background(), formed(got, d.general))
	if errM != nil || errR != nil {
		if !errors.Is(errM, sluice.ClockUnsafe) || !errors.Is(errR, sluice.ClockUnsafe) {
			d.t.Fatalf("seed %d step %d: %s now=%d: Evaluate(op=%v, cost=%d): memstore %v, redisstore %v: want both ClockUnsafe or neither", seed, step, describe(ps), d.now, op, cost, errM, errR)
		}
		return false, true
	}
	if !slices.Equal(got.Statuses, want.Statuses) {
		d.t.Fatalf("seed %d step %d: policies %s now=%d: Evaluate(op=%v, cost=%d) = %+v, memstore says %+v", seed, step, describe(ps), d.now, op, cost, got.Statuses, want.Statuses)
	}
	return got.Statuses[0].Allowed, false
}

// diffPeriods is TestDifferential's calendar case on the caller's clock:
// a period policy alone (in the short form or the general one), or beside
// other algorithms' policies when multi is set.
func diffPeriods(t *testing.T, c redis.UniversalClient, seed uint64, general, multi bool) {
	d := newDiff(t, c)
	d.general = general
	r := rand.New(rand.NewPCG(seed, 0xca1e<<2|uint64(boolBit(general))<<1|boolBit(multi)))
	const episode = 300
	var ps []*sluice.Policy
	var allowed, denied, refused, changes int
	for step := range *diffSteps / 2 {
		switch {
		case step%episode == 0:
			ps = []*sluice.Policy{randomPeriodPolicy(t, r, "p0")}
			for i := range boolInt(multi) * r.IntN(3) {
				ps = append(ps, randomPolicy(r, fmt.Sprint("p", i+1), algorithms[r.IntN(len(algorithms))]))
			}
			d.newSubject(r, seed, step)
		case r.IntN(20) == 0:
			ps[0] = randomPeriodPolicy(t, r, "p0") // another period or zone under one revision
			changes++
		}
		w := span(ps[0])
		if r.IntN(3) == 0 && len(ps) > 1 {
			w = span(ps[1])
		}
		dt := randomStep(r, w)
		cost := randomCost(r, ps[0])
		refund := cost > 0 && r.IntN(8) == 0
		for _, p := range ps {
			cost = min(cost, p.MaxCost)
			refund = refund && p.Algorithm != sluice.SlidingWindow
		}
		ok, no := d.stepPeriods(seed, step, dt, cost, refund, ps)
		switch {
		case no:
			refused++
		case ok:
			allowed++
		default:
			denied++
		}
	}
	t.Logf("%d steps: %d allowed, %d denied, %d refused (state beyond the periods around the clock), %d changes of period or zone", *diffSteps/2, allowed, denied, refused, changes)
	if allowed == 0 || denied == 0 {
		t.Fatalf("%d allowed, %d denied: the sequence never reached both", allowed, denied)
	}
}

// calendar is a made-up calendar of periods of a few ms on Redis time:
// its boundaries, ascending, extended as Redis's clock moves on.
type calendar struct {
	r      *rand.Rand
	bounds []int64
}

// around returns the four bounds of the calendar around t (the period
// before the one holding t, that one, the next and its end), growing the
// calendar as needed.
func (c *calendar) around(t int64) [4]int64 {
	if len(c.bounds) == 0 {
		c.bounds = append(c.bounds, t-5_000-c.r.Int64N(5_000))
	}
	for c.bounds[len(c.bounds)-1] <= t+40_000 {
		c.bounds = append(c.bounds, c.bounds[len(c.bounds)-1]+2_000+c.r.Int64N(18_000))
	}
	i := 1
	for c.bounds[i] <= t {
		i++
	}
	// c.bounds[i-1] <= t < c.bounds[i]
	if i < 2 {
		c.bounds = append([]int64{c.bounds[0] - 2_000 - c.r.Int64N(18_000)}, c.bounds...)
		i++
	}
	return [4]int64{c.bounds[i-2], c.bounds[i-1], c.bounds[i], c.bounds[i+1]}
}

// diffPeriodsRedisClock is the Redis-clock mode of the calendar case: the
// store sends the bounds of a calendar of short periods around the last
// time Redis answered (the caller's clock, a little behind Redis's), the
// engine twin decides at the time the script answers on the bounds sent,
// and one step in twenty sends bounds that ended before Redis's clock (a
// caller clock far behind): refused as ClockUnsafe, nothing written.
func diffPeriodsRedisClock(t *testing.T, c redis.UniversalClient, seed uint64, general, batched bool) {
	var at int64
	s := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{ExtraTTL: time.Hour}), Batched: batched, OnRedisTime: func(now int64) { at = now }}
	r := rand.New(rand.NewPCG(seed, 0xca1e<<8|boolBit(batched)<<1|boolBit(general)))
	cal := &calendar{r: r}
	var sent [4]int64
	var off bool
	s.Bounds = func(p *sluice.Policy) [4]int64 {
		sent = cal.around(at)
		if off {
			sent = [4]int64{sent[0] - 300_000, sent[1] - 300_000, sent[2] - 300_000, sent[3] - 300_000}
		}
		return sent
	}
	twin := &engineTwin{states: map[string]*algorithm.State{}}
	at = redisNow(t, c)
	var ps []*sluice.Policy
	subj := ""
	var allowed, denied, refused int
	steps := *diffSteps / 4
	for step := range steps {
		if step%200 == 0 || r.IntN(40) == 0 {
			ps = []*sluice.Policy{randomPeriodPolicy(t, r, "p0")}
			if step%200 == 0 {
				subj = fmt.Sprintf("%s.%d.%d", subject(t), seed, step)
			}
		}
		off = r.IntN(20) == 0
		cost := randomCost(r, ps[0])
		op := sluice.Spend
		switch {
		case cost > 0 && r.IntN(8) == 0:
			op = sluice.Refund
		case cost == 0:
			op = sluice.Peek
		}
		got := &sluice.Evaluation{Op: op, Subject: subj, Policies: ps, Cost: cost}
		before := at
		err := s.Evaluate(context.Background(), formed(got, general))
		if off {
			if !errors.Is(err, sluice.ClockUnsafe) {
				t.Fatalf("seed %d step %d: bounds %v ended before Redis's clock (%d at the last reply): Evaluate = %v, %+v, want ClockUnsafe", seed, step, sent, before, err, got.Statuses)
			}
			refused++
			at = redisNow(t, c) // a refusal answers no time: the caller's clock reads Redis's again
			continue
		}
		if late(err, sent, before) {
			// The call reached Redis after the periods sent had ended (a
			// loaded machine): refused, as it must be, and nothing written.
			refused++
			at = redisNow(t, c)
			continue
		}
		if err != nil {
			t.Fatalf("seed %d step %d: redisstore Evaluate(op=%v, cost=%d) on %s with bounds %v: %v", seed, step, op, cost, describe(ps), sent, err)
		}
		want, err := twin.evaluatePeriods(got, at, sent)
		if err != nil {
			t.Fatalf("seed %d step %d: engine at %d: %v", seed, step, at, err)
		}
		if !slices.Equal(got.Statuses, want) {
			t.Fatalf("seed %d step %d: %s at %d (Redis time), bounds %v: Evaluate(op=%v, cost=%d) = %+v, the engine says %+v", seed, step, describe(ps), at, sent, op, cost, got.Statuses, want)
		}
		if got.Statuses[0].Allowed {
			allowed++
		} else {
			denied++
		}
	}
	t.Logf("%d steps on Redis time: %d allowed, %d denied, %d refused (bounds behind Redis's clock), %d periods", steps, allowed, denied, refused, len(cal.bounds))
	if allowed+denied < steps/2 {
		t.Fatalf("only %d of %d steps decided: the periods sent were behind Redis's clock too often", allowed+denied, steps)
	}
}

// outsideAt reads the time a refusal for a time outside the periods names.
var outsideAt = regexp.MustCompile(`time (\d+) lies outside the periods`)

// late reports whether err refuses a decision because Redis's clock, at
// the time the refusal names (after before, the last time Redis
// answered), had passed the end of the periods sent.
func late(err error, sent [4]int64, before int64) bool {
	if !errors.Is(err, sluice.ClockUnsafe) {
		return false
	}
	m := outsideAt.FindStringSubmatch(err.Error())
	if m == nil {
		return false
	}
	at, perr := strconv.ParseInt(m[1], 10, 64)
	return perr == nil && at >= sent[3] && at >= before
}

// evaluatePeriods is engineTwin.evaluate for periods: the policies get
// the bounds the store sent.
func (e *engineTwin) evaluatePeriods(ev *sluice.Evaluation, now int64, bounds [4]int64) ([]sluice.Status, error) {
	n := len(ev.Policies)
	a := algorithm.Evaluation{Now: now, Op: evaluation.Op(ev), Cost: ev.Cost, MaxRegression: -1,
		Decisions: make([]algorithm.Decision, n), Writes: make([]algorithm.Write, n)}
	keys := make([]string, n)
	for i, p := range ev.Policies {
		ap := evaluation.Policy(p)
		evaluation.SetBounds(&ap, bounds)
		keys[i] = fmt.Sprintf("%s/%s/%d/period", ev.Subject, p.ID, p.Revision)
		a.Policies, a.States = append(a.Policies, ap), append(a.States, e.states[keys[i]])
	}
	if err := algorithm.Check(a.Op, a.Policies, a.Cost, 0, "", false); err != nil {
		return nil, err
	}
	if err := algorithm.Evaluate(&a); err != nil {
		return nil, err
	}
	if a.Commit {
		for i, k := range keys {
			if w := &a.Writes[i]; w.Expires <= now {
				delete(e.states, k)
			} else {
				if e.states[k] == nil {
					e.states[k] = new(algorithm.State)
				}
				e.states[k].Apply(w)
			}
		}
	}
	out := make([]sluice.Status, n)
	for i, p := range ev.Policies {
		evaluation.SetStatus(&out[i], p, &a.Decisions[i])
	}
	return out, nil
}

// redisNow returns Redis's clock, µs.
func redisNow(t *testing.T, c redis.UniversalClient) int64 {
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// TestDifferentialPeriods runs the calendar cases of the differential
// test: on the caller's clock in the short and general forms and beside
// other policies, and on Redis time in the short, general and batched
// forms.
func TestDifferentialPeriods(t *testing.T) {
	seed := *diffSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -sluice.diffseed=%d)", seed, seed)
	c := standaloneClient(t)
	for _, form := range []string{"short", "general"} {
		t.Run("caller-clock/"+form, func(t *testing.T) {
			t.Parallel()
			diffPeriods(t, c, seed, form == "general", false)
		})
	}
	t.Run("caller-clock/multi", func(t *testing.T) {
		t.Parallel()
		diffPeriods(t, c, seed, false, true)
	})
	// Estimates settled on calendar periods, alone and beside the other
	// algorithms that settle: given back into the estimate's period while
	// it is open, the excess counted in the period open at the settle.
	for _, form := range []string{"short", "general"} {
		t.Run("settle/"+form, func(t *testing.T) {
			t.Parallel()
			diffSettle(t, c, seed, []sluice.Algorithm{settlePeriod}, form == "general", *diffSteps/4)
		})
	}
	t.Run("settle/multi", func(t *testing.T) {
		t.Parallel()
		diffSettle(t, c, seed, []sluice.Algorithm{settlePeriod, sluice.FixedWindow, sluice.TokenBucket, sluice.GCRA}, false, *diffSteps/4)
	})
	for _, form := range []string{"short", "general", "batched"} {
		t.Run("redis-clock/"+form, func(t *testing.T) {
			t.Parallel()
			diffPeriodsRedisClock(t, c, seed, form == "general", form == "batched")
		})
	}
}
