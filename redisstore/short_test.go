package redisstore

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/form"
	"github.com/sluicehq/sluice/internal/testkit/draw"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/sluicetest"
)

// shortSteps is how many decisions each sequence of
// TestShortMatchesGeneral takes.
const shortSteps = 500

var shortSeed = flag.Uint64("sluice.shortseed", 0, "seed of TestShortMatchesGeneral; 0 picks one")

// TestShortMatchesGeneral drives the same random sequences through the
// short course (each Evaluation recorded in its form as the Limiter
// records it: decideShort, short.lua) and the general one (the same
// Evaluation built without it: decide, main), each through a store of
// its own prefix on one real Redis, and demands identical decisions and
// identical Redis state (every key's type, value and expiry) after every
// step: spends within and beyond MaxCost, held spends, peeks, refunds
// and renewals (the general course on both), priority classes, a lease's
// acquire and release, clocks that step back, new numbers and another
// algorithm under one revision. On the caller's clock the two are sent
// alone (Evaluate) or in one decideAll call; on Redis time in one
// decideAll call, so that they share its time: the short decision by its
// spec (specRun) or by its own arguments (fastMain).
func TestShortMatchesGeneral(t *testing.T) {
	seed := *shortSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -sluice.shortseed=%d)", seed, seed)
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	if err := c.FunctionLoadReplace(context.Background(), librarySource).Err(); err != nil {
		t.Fatal(err)
	}
	algs := []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA, sluice.Concurrency}
	for _, mode := range []string{"caller/alone", "caller/together", "redis/by-spec", "redis/together"} {
		for _, a := range algs {
			t.Run(mode+"/"+a.String(), func(t *testing.T) {
				t.Parallel()
				r := rand.New(rand.NewPCG(seed, uint64(a)))
				sh := newShortPair(t, c, mode, algs)
				for step := range shortSteps {
					sh.step(r, seed, step, a)
				}
				if sh.taken < shortSteps/2 {
					t.Fatalf("only %d of %d steps were in the short form", sh.taken, shortSteps)
				}
			})
		}
	}
}

// shortPair is one sequence of TestShortMatchesGeneral: the store of the
// short course and the store of the general one, on one Redis.
type shortPair struct {
	t       *testing.T
	c       *redis.Client
	stores  [2]*Store // the short course's, the general one's
	clock   *sluicetest.Clock
	mode    string
	algs    []sluice.Algorithm
	p       *sluice.Policy
	subject string
	slack   int64 // the most ms two writes of one step lay apart, since the subject's first
	taken   int   // the decisions in the short form
}

func newShortPair(t *testing.T, c *redis.Client, mode string, algs []sluice.Algorithm) *shortPair {
	sh := &shortPair{t: t, c: c, mode: mode, algs: algs}
	var clock sluice.Clock
	if strings.HasPrefix(mode, "caller/") {
		sh.clock = sluicetest.NewClock()
		clock = sh.clock
	}
	for i, prefix := range []string{"short:", "general:"} {
		// An hour's ExtraTTL keeps a key from expiring between the two
		// writes and the state's read (a fixed window's on Redis time
		// still ends at its window's end, in both at once).
		s, err := New(c, Options{Prefix: prefix, Clock: clock, ExtraTTL: time.Hour, Senders: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sh.stores[i] = s
	}
	return sh
}

// step takes one decision on both courses and compares them.
func (sh *shortPair) step(r *rand.Rand, seed uint64, step int, a sluice.Algorithm) {
	t := sh.t
	switch {
	case step%100 == 0:
		sh.p = draw.Policy(r, a, "p", shortWindows)
		sh.subject = fmt.Sprintf("%s.%d.%d", strings.ReplaceAll(t.Name(), "/", "."), seed, step)
		sh.slack = 0
	case r.IntN(25) == 0:
		sh.p = draw.Policy(r, a, "p", shortWindows) // new numbers under the same revision
	case r.IntN(60) == 0:
		sh.p = draw.Policy(r, sh.algs[r.IntN(len(sh.algs))], "p", shortWindows) // another algorithm's state under it
	}
	if sh.clock != nil {
		sh.clock.Advance(time.Duration(draw.Step(r, (sh.p.Window+sh.p.LeaseTTL).Microseconds())) * time.Microsecond)
	}
	general := shortRequest(r, sh.subject, sh.p)
	short := *general // copied before its form is recorded: general stays general
	form.Record(&short)
	if evaluation.Short(&short) {
		sh.taken++
	}
	evs := [2]*sluice.Evaluation{&short, general}
	from := sh.redisMillis()
	var got [2]string
	if sh.mode == "caller/alone" {
		for i, s := range sh.stores {
			err := s.Evaluate(context.Background(), evs[i])
			got[i] = fmt.Sprintf("%+v replayed=%v err=%v", evs[i].Statuses, evs[i].Replayed, err)
		}
	} else {
		vals, errs := sh.together(evs, sh.mode == "redis/by-spec")
		for i := range got {
			got[i] = fmt.Sprintf("%v err=%v", vals[i], errs[i])
		}
	}
	// A TTL counts from the time its write runs (in one call too: a long
	// log's takes a while), and a key keeps the expiry of the step that
	// wrote it last: two expiries lie no further apart than the two writes
	// of some step of the subject.
	sh.slack = max(sh.slack, sh.redisMillis()-from+1)
	if strings.ReplaceAll(got[0], "short:{", "general:{") != got[1] {
		t.Fatalf("seed %d step %d: %v cost %d hold %v class %q lease %q on %+v: short = %s; general = %s",
			seed, step, general.Op, general.Cost, general.Hold, general.Priority, general.LeaseID, *sh.p, got[0], got[1])
	}
	states := sh.states()
	if !sameStates(states[0], states[1], sh.slack) {
		t.Fatalf("seed %d step %d: %v cost %d hold %v on %+v (expiries within %dms): the short course left %+v, the general one %+v",
			seed, step, general.Op, general.Cost, general.Hold, *sh.p, sh.slack, states[0], states[1])
	}
}

// together sends evs[i] as stores[i] sends it, both in one decideAll
// call, after the checks Evaluate runs first; on Redis time they share the
// call's time. A short decision on Redis time goes by its spec when
// bySpec, else by its own arguments. It returns each reply's values as
// send returns them, or its error as send types it.
func (sh *shortPair) together(evs [2]*sluice.Evaluation, bySpec bool) (vals [2][]int64, errs [2]error) {
	ctx := context.Background()
	var batch []*pending
	at := [2]int{-1, -1}
	for i, s := range sh.stores {
		ev := evs[i]
		var room [4]algorithm.Policy
		if err := evaluation.Check(ev, room[:]); err != nil {
			errs[i] = fmt.Errorf("redisstore: %w", err)
			continue
		}
		var p *pending
		if evaluation.Short(ev) {
			p = s.shortPending(sh.subject, ev, nil)
			if !bySpec {
				p.spec = ""
			}
		} else {
			p = s.generalPending(sh.subject, ev, "", "", nil, nil)
		}
		p.mark.arm(p.args)
		p.ref.written.Store(false)
		p.cmd, p.ctx, p.err, p.wrote, p.wait, p.compact = scriptCmd{}, ctx, nil, false, nil, false
		at[i] = len(batch)
		batch = append(batch, p)
	}
	if len(batch) == 0 {
		return vals, errs
	}
	cmd := allCmd(ctx, batch)
	if err := sh.c.Process(ctx, cmd); err != nil && !isReplyError(err) {
		sh.t.Fatalf("decideAll: %v", err)
	}
	spread(cmd, batch)
	for i, s := range sh.stores {
		if at[i] < 0 {
			continue
		}
		p := batch[at[i]]
		if err := p.cmdErr(); err != nil {
			errs[i] = s.typeErr(ctx, "run script", true, err)
		} else {
			vals[i], errs[i] = p.values(nil)
		}
		s.release(p)
	}
	return vals, errs
}

// isReplyError reports whether err is an error reply of Redis's.
func isReplyError(err error) bool {
	_, ok := err.(redis.Error)
	return ok
}

// redisMillis returns Redis's time in ms.
func (sh *shortPair) redisMillis() int64 {
	now, err := sh.c.Time(context.Background()).Result()
	if err != nil {
		sh.t.Fatal(err)
	}
	return now.UnixMilli()
}

// keyState is one key as TestShortMatchesGeneral compares it: its name
// after the store's prefix, its type, its absolute expiry in ms
// (PEXPIRETIME) and its value (a string's; a list's or a sorted set's
// members, with their scores).
type keyState struct {
	name    string
	typ     string
	expires int64
	value   []any
}

// stateScript reads every key of the store of prefix ARGV[i] (i = 1,
// 2) whose name after it matches ARGV[3], in one call, so that both
// stores' keys are read at one instant (a script sees Redis's time
// frozen: a key expires in both or in neither): each key's name without
// the prefix, type, PEXPIRETIME and value.
const stateScript = `
local out = {}
for i = 1, 2 do
  local keys = {}
  for _, k in ipairs(redis.call('KEYS', ARGV[i] .. ARGV[3])) do
    local t = redis.call('TYPE', k).ok
    local v = {}
    if t == 'string' then
      v = {redis.call('GET', k)}
    elseif t == 'list' then
      v = redis.call('LRANGE', k, 0, -1)
    elseif t == 'zset' then
      v = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
    end
    keys[#keys + 1] = {string.sub(k, #ARGV[i] + 1), t, redis.call('PEXPIRETIME', k), v}
  end
  out[i] = keys
end
return out
`

// states returns the keys of the sequence's subject in the short
// course's store and in the general one's, by name.
func (sh *shortPair) states() (out [2][]keyState) {
	res, err := sh.c.Eval(context.Background(), stateScript, nil, "short:", "general:", "{"+sh.subject+"}*").Slice()
	if err != nil {
		sh.t.Fatal(err)
	}
	for i := range out {
		for _, r := range res[i].([]any) {
			f := r.([]any)
			out[i] = append(out[i], keyState{name: f[0].(string), typ: f[1].(string), expires: f[2].(int64), value: f[3].([]any)})
		}
		slices.SortFunc(out[i], func(a, b keyState) int { return strings.Compare(a.name, b.name) })
	}
	return out
}

// sameStates reports whether a and b hold the same keys with the same
// types and values, and expiries at most slack ms apart (the two writes
// happen that far apart at most).
func sameStates(a, b []keyState, slack int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		d := a[i].expires - b[i].expires
		if a[i].name != b[i].name || a[i].typ != b[i].typ || !reflect.DeepEqual(a[i].value, b[i].value) || d > slack || -d > slack {
			return false
		}
	}
	return true
}

// shortRequest draws one decision on p for subject, in the general form:
// most of them of the short form's shape, some not, some refused.
func shortRequest(r *rand.Rand, subject string, p *sluice.Policy) *sluice.Evaluation {
	ev := &sluice.Evaluation{Op: sluice.Spend, Subject: subject, Policies: []*sluice.Policy{p}, Cost: 1}
	if p.Algorithm == sluice.Concurrency {
		ev.Op, ev.LeaseID = sluice.Acquire, fmt.Sprint("lease-", r.IntN(4))
		switch r.IntN(6) {
		case 0, 1:
			ev.Op, ev.Cost = sluice.Release, 0
		case 2:
			ev.Op, ev.Cost = sluice.Renew, 0 // the general course on both
		case 3:
			ev.LeaseID = "" // refused on both
		}
	} else {
		switch r.IntN(12) {
		case 0, 1:
			ev.Op, ev.Cost = sluice.Peek, 0
		case 2:
			ev.Op = sluice.Refund // the general course on both
			if p.Algorithm == sluice.SlidingWindow {
				ev.Op = sluice.Spend
			}
		case 3:
			ev.Cost = p.MaxCost + int64(r.IntN(2)) // beyond it: refused on both
		case 4:
			ev.Cost = 1 + r.Int64N(min(p.MaxCost, 1000))
		case 5, 6:
			ev.Hold = time.Duration(1+r.Int64N(p.Window.Microseconds()+1)) * time.Microsecond // some too long: refused on both
		case 7:
			ev.LeaseID = "stray" // refused on both
		}
	}
	if r.IntN(4) == 0 {
		ev.Priority = []string{"sheddable", "default", "other"}[r.IntN(3)]
	}
	return ev
}

// shortWindows are the windows of the drawn policies: from 1ms (which
// pass in a few steps on Redis time) to an hour. A step of the caller's
// clock past the store's 1s MaxClockRegression now and then is
// ClockUnsafe on both courses.
var shortWindows = []time.Duration{time.Millisecond, 3 * time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, time.Hour}
