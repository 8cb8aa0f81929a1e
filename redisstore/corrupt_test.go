package redisstore_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/evaluation"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// maxExact is 2^53 µs: no time the script is given or reads lies at or
// beyond it.
const maxExact = 1 << 53

// TestCorruptShapes: states of the right type and of integers that no
// decision of the script can leave behind, written raw under the key the
// store uses, are Unavailable (corrupt_state) saying which key and why;
// the decision writes nothing, not even to the healthy policy beside the
// corrupt one, in the general form, the short one alone and batched; a
// reset clears the state and the next check is decided on absent state.
func TestCorruptShapes(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	batched := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{}), Batched: true}
	now := float64(time.Now().UnixMicro()) // Redis's clock: this machine's
	minute := float64(time.Minute.Microseconds())
	log := func(entries ...float64) func(string) error {
		return func(k string) error {
			vals := make([]any, len(entries))
			for i, e := range entries {
				vals[i] = int64(e)
			}
			return c.RPush(ctx, k, vals...).Err()
		}
	}
	leases := func(expiries ...float64) func(string) error {
		return func(k string) error {
			zs := make([]redis.Z, len(expiries))
			for i, e := range expiries {
				zs[i] = redis.Z{Score: e, Member: string(rune('a' + i))}
			}
			return c.ZAdd(ctx, k, zs...).Err()
		}
	}
	for _, tc := range []struct {
		name string
		alg  sluice.Algorithm
		harm func(key string) error
		want string
	}{
		// The 228 years of Retry-After measured from outside: a window that
		// ends 2^53 µs after the epoch. (On Redis time a fixed window
		// keeps its end and count, algorithm.FixedWindowEnd.)
		{"fixed window end 2^53 ahead", sluice.FixedWindow, setBinary(c, maxExact-1, 5), "after the time of this call"},
		{"fixed window on the caller clock's record", sluice.FixedWindow, setBinary(c, now, 1, now), "want 2 integers"},
		{"fixed window ends 366 days ahead", sluice.FixedWindow, setBinary(c, now+366*24*60*minute, 1), "after the time of this call"},
		{"fixed window count above any limit", sluice.FixedWindow, setBinary(c, now+minute, 1e9+1), "count 1000000001"},
		{"fixed window count 0", sluice.FixedWindow, setBinary(c, now+minute, 0), "count 0"},
		{"fixed window end 0", sluice.FixedWindow, setBinary(c, 0, 1), "end 0: want a time after the epoch"},
		{"negative zero", sluice.FixedWindow, setBinary(c, now+minute, math.Copysign(0, -1)), "field 2 = -0"},
		{"negative zero remainder", sluice.GCRA, setBinary(c, now+minute, math.Copysign(0, -1), 5, minute, now), "field 2 = -0"},
		{"fraction", sluice.SlidingWindow, setBinary(c, now, 2.5, 0, now), "field 2 = 2.5"},
		{"NaN", sluice.GCRA, setBinary(c, math.NaN(), 0, 5, minute, now), "field 1 = nan"},
		{"infinity", sluice.TokenBucket, setBinary(c, math.Inf(1), now, minute), "field 1 = inf"},
		{"sliding window counts above any limit", sluice.SlidingWindow, setBinary(c, now, 1, 2e9, now), "counts 1, 2000000000"},
		{"sliding window last write before start", sluice.SlidingWindow, setBinary(c, now, 1, 0, now-1), "want start <= last"},
		{"token bucket window 0", sluice.TokenBucket, setBinary(c, 0, now, 0), "window 0"},
		{"token bucket above any full bucket", sluice.TokenBucket, setBinary(c, 1e12, now, 1000), "want fewer than a full bucket"},
		{"TAT far ahead", sluice.GCRA, setBinary(c, now+1<<52, 0, 5, minute, now), "µs after the last write"},
		{"TAT before its write", sluice.GCRA, setBinary(c, now-1, 0, 5, minute, now), "µs after the last write"},
		{"GCRA remainder above its limit", sluice.GCRA, setBinary(c, now+minute, 5, 5, minute, now), "remainder 5"},
		{"log unsorted", sluice.SlidingLog, log(now, now-3, now-2, now-1), "want one in (newest - 365 days, newest]"},
		{"log unsorted along the search", sluice.SlidingLog, log(now-2*minute, now-10e6, now-3*minute, now-3*minute, now-3*minute, now-5e6), "entries are not ascending"},
		{"log unsorted at the retry entry", sluice.SlidingLog, log(now-10e6, now-3*minute, now-9e6, now-8e6, now-7e6, now-6e6), "entries are not ascending"},
		{"log entry 365 days before the newest", sluice.SlidingLog, log(now-365*24*60*minute, now), "want one in (newest - 365 days, newest]"},
		{"log entry ahead", sluice.SlidingLog, log(now + 2*minute), "after the time of this call"},
		{"log fraction", sluice.SlidingLog, func(k string) error { return c.RPush(ctx, k, "1767225600000000.5").Err() }, "want an integer > 0"},
		{"lease expiry far ahead", sluice.Concurrency, leases(now + 60*minute), "after the time of this call"},
		{"lease expiry a day before the latest", sluice.Concurrency, leases(now-24*60*minute+minute, now+minute), "want one after the latest"},
		{"lease expiry negative zero", sluice.Concurrency, leases(math.Copysign(0, -1), now+minute), "want an integer > 0"},
		{"the only lease's expiry negative zero", sluice.Concurrency, leases(math.Copysign(0, -1)), "want an integer > 0"},
		{"leases of another type", sluice.Concurrency, func(k string) error { return c.Set(ctx, k, "a", 0).Err() }, "holds another type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			subj := subject(t)
			var p *sluice.Policy
			if tc.alg == sluice.Concurrency {
				lp := evaluation.Defaults(sluice.Policy{ID: "corrupt", Algorithm: sluice.Concurrency, Limit: 5, LeaseTTL: time.Minute})
				p = &lp
			} else {
				p = policy(t, "corrupt", tc.alg, 5, time.Minute)
			}
			other := policy(t, "fine", sluice.FixedWindow, 5, time.Minute)
			mustEvaluate(t, s, subj, 1, other)
			key := s.Key(subj, p)
			if err := tc.harm(key); err != nil {
				t.Fatal(err)
			}
			if err := c.Expire(ctx, key, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			dump := func() [2]string {
				return [2]string{c.Dump(ctx, key).Val(), c.Get(ctx, s.Key(subj, other)).Val()}
			}
			before := dump()
			ev := spending(&sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{other, p}, Cost: 1, LeaseID: "l1"})
			err := s.Evaluate(ctx, ev)
			if !errors.Is(err, sluice.CorruptState) || !strings.Contains(err.Error(), "SLUICE_CORRUPT "+key+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Evaluate over %s = %v (statuses %+v), want CorruptState naming %s, saying %q", tc.name, err, ev.Statuses, key, tc.want)
			}
			if after := dump(); after != before {
				t.Fatalf("a decision refused for corrupt state wrote: %q, then %q", before, after)
			}
			// The other entry shapes: the short decision alone and batched
			// (a decideAll call: fixedWindowFloor for a fixed window).
			for _, st := range []sluice.Store{s, batched} {
				ev := formed(spending(&sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, Cost: 1, LeaseID: "l1"}), false)
				err := st.Evaluate(ctx, ev)
				if !errors.Is(err, sluice.CorruptState) || !strings.Contains(err.Error(), "SLUICE_CORRUPT "+key+": ") || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Evaluate (batched %v) over %s alone = %v (statuses %+v), want CorruptState naming %s, saying %q", st == batched, tc.name, err, ev.Statuses, key, tc.want)
				}
				if after := dump(); after != before {
					t.Fatalf("a decision (batched %v) refused for corrupt state wrote: %q, then %q", st == batched, before, after)
				}
			}
			if p.Algorithm == sluice.Concurrency {
				// A release of lease "a", the only one in the single-lease
				// cases: short.lua's leaseFloor reads it, alone and batched.
				for _, st := range []sluice.Store{s, batched} {
					ev := formed(&sluice.Evaluation{Op: sluice.Release, Subject: subj, Policies: []*sluice.Policy{p}, LeaseID: "a"}, false)
					err := st.Evaluate(ctx, ev)
					if !errors.Is(err, sluice.CorruptState) || !strings.Contains(err.Error(), "SLUICE_CORRUPT "+key+": ") || !strings.Contains(err.Error(), tc.want) {
						t.Fatalf("release (batched %v) over %s = %v (statuses %+v), want CorruptState naming %s, saying %q", st == batched, tc.name, err, ev.Statuses, key, tc.want)
					}
					if after := dump(); after != before {
						t.Fatalf("a release (batched %v) refused for corrupt state wrote: %q, then %q", st == batched, before, after)
					}
				}
			}
			l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
			if err != nil {
				t.Fatal(err)
			}
			op := sluice.Spend
			if p.Algorithm == sluice.Concurrency {
				op = sluice.Acquire
			}
			if o := l.Check(ctx, sluice.Request{Op: op, Policy: "corrupt", Subject: subj}); o.Kind != sluice.Unavailable || o.Cause != sluice.CorruptState {
				t.Fatalf("Check over %s = %+v, want Unavailable, corrupt_state", tc.name, o)
			}
			if o := l.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: "corrupt", Subject: subj}); o.Kind != sluice.Allowed {
				t.Fatalf("Reset over %s = %+v (err %v), want allowed", tc.name, o, o.Err)
			}
			if o := l.Check(ctx, sluice.Request{Op: op, Policy: "corrupt", Subject: subj}); o.Kind != sluice.Allowed || o.Remaining != 4 {
				t.Fatalf("Check after the reset = %+v (err %v), want allowed with 4 left", o, o.Err)
			}
		})
	}
}

// TestCorruptCarriedState: during a key rotation, the state read under an
// older subject is held to the same rules before anything is kept under
// the new one: a decision over a corrupt one is CorruptState and
// writes nothing under either subject.
func TestCorruptCarriedState(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	now := float64(time.Now().UnixMicro())
	day := float64(24 * time.Hour.Microseconds())
	lease := evaluation.Defaults(sluice.Policy{ID: "corrupt", Algorithm: sluice.Concurrency, Limit: 5, LeaseTTL: time.Minute})
	for _, tc := range []struct {
		name string
		p    *sluice.Policy
		harm func(key string) error
		want string
	}{
		{"fixed window count 0", policy(t, "corrupt", sluice.FixedWindow, 5, time.Minute), setBinary(c, now+1, 0), "count 0"},
		{"fixed window ending 366 days ahead", policy(t, "corrupt", sluice.FixedWindow, 5, time.Minute), setBinary(c, now+366*day, 1), "end is"},
		{"GCRA TAT far ahead", policy(t, "corrupt", sluice.GCRA, 5, time.Minute), setBinary(c, now+1<<52, 0, 5, 60e6, now), "µs after the last write"},
		{"log 365 days long", policy(t, "corrupt", sluice.SlidingLog, 5, time.Minute), func(k string) error { return c.RPush(ctx, k, int64(now-365*day), int64(now)).Err() }, "want one in (newest - 365 days, newest]"},
		{"log unsorted", policy(t, "corrupt", sluice.SlidingLog, 5, time.Minute), func(k string) error { return c.RPush(ctx, k, int64(now), int64(now-1)).Err() }, "want ascending integers"},
		{"leases 365 days apart", &lease, func(k string) error {
			return c.ZAdd(ctx, k, redis.Z{Score: now - 365*day + 1, Member: "a"}, redis.Z{Score: now + 1, Member: "b"}).Err()
		}, "want one in (newest - 365 days, newest]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, neu := subject(t), subject(t)
			if err := tc.harm(s.Key(old, tc.p)); err != nil {
				t.Fatal(err)
			}
			if err := c.Expire(ctx, s.Key(old, tc.p), time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			before := c.Dump(ctx, s.Key(old, tc.p)).Val()
			ev := spending(&sluice.Evaluation{Subject: neu, Previous: []string{old}, Policies: []*sluice.Policy{tc.p}, Cost: 1, LeaseID: "l1"})
			err := s.Evaluate(ctx, ev)
			if !errors.Is(err, sluice.CorruptState) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Evaluate carrying %s = %v (statuses %+v), want CorruptState saying %q", tc.name, err, ev.Statuses, tc.want)
			}
			if n := c.Exists(ctx, s.Key(neu, tc.p)).Val(); n != 0 {
				t.Fatalf("a decision refused for a corrupt carried state kept %s", s.Key(neu, tc.p))
			}
			if after := c.Dump(ctx, s.Key(old, tc.p)).Val(); after != before {
				t.Fatalf("a decision refused for a corrupt carried state changed the older subject's: %q, then %q", before, after)
			}
		})
	}
}

// spending makes ev, a spend of its cost carrying a lease id, the
// operation its policies take: an acquisition of that lease when one of
// them is a concurrency policy, else a plain spend without it.
func spending(ev *sluice.Evaluation) *sluice.Evaluation {
	ev.Op = sluice.Spend
	if slices.ContainsFunc(ev.Policies, func(p *sluice.Policy) bool { return p.Algorithm == sluice.Concurrency }) {
		ev.Op = sluice.Acquire
	} else {
		ev.LeaseID = ""
	}
	return ev
}

// TestCorruptRecords holds the adversary's two records of issue 32 (point
// 3) to what a decision writes: a sliding log with older entries pushed
// after its newest (it read as expired and admitted 7 of 5), and a
// remembered evaluation-id reply that no decision gives (it was replayed
// as allowed with 999 999 left). Each is corrupt_state through a Limiter,
// in the short form and the general one alike, and nothing is written.
func TestCorruptRecords(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	t.Run("log pushed after its newest", func(t *testing.T) {
		p := policy(t, "login", sluice.SlidingLog, 5, time.Minute)
		l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
		if err != nil {
			t.Fatal(err)
		}
		subj := subject(t)
		for range 2 {
			if o := l.Check(ctx, sluice.Request{Policy: "login", Subject: subj}); o.Kind != sluice.Allowed {
				t.Fatalf("Check = %+v, want allowed", o)
			}
		}
		key := s.Key(subj, p)
		if err := c.RPush(ctx, key, 1, 2).Err(); err != nil {
			t.Fatal(err)
		}
		before := c.Dump(ctx, key).Val()
		for _, id := range []string{"", "retry-1"} { // the short form, then the general one
			o := l.Check(ctx, sluice.Request{Policy: "login", Subject: subj, EvaluationID: id})
			if o.Kind != sluice.Unavailable || o.Cause != sluice.CorruptState {
				t.Fatalf("Check(id %q) over a log pushed after its newest = %+v (err %v), want Unavailable, corrupt_state", id, o, o.Err)
			}
		}
		if after := c.Dump(ctx, key).Val(); after != before {
			t.Fatalf("a decision refused for a corrupt log wrote: %q, then %q", before, after)
		}
	})
	t.Run("forged evaluation-id reply", func(t *testing.T) {
		p := policy(t, "pay", sluice.FixedWindow, 5, time.Minute)
		l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
		if err != nil {
			t.Fatal(err)
		}
		subj := subject(t)
		req := sluice.Request{Policy: "pay", Subject: subj, EvaluationID: "order-7"}
		if o := l.Check(ctx, req); o.Kind != sluice.Allowed {
			t.Fatalf("Check = %+v, want allowed", o)
		}
		hkey := s.Key(subj, p)
		hkey = hkey[:strings.LastIndexByte(hkey, ':')] + ":idv"
		for _, forged := range []string{"1,5,999999,0,0", "2,5,4,60000000,0", "1,5,4,60000000,7", "0,5,0,60000000,0", "1,0,0,0,0", "1,5,-1,0,0", "1,5,4,-3,0"} {
			if err := c.HSet(ctx, hkey, "s:order-7", forged).Err(); err != nil {
				t.Fatal(err)
			}
			o := l.Check(ctx, req)
			if o.Kind != sluice.Unavailable || o.Cause != sluice.CorruptState {
				t.Fatalf("Check over the remembered reply %q = %+v (err %v), want Unavailable, corrupt_state", forged, o, o.Err)
			}
		}
	})
}

// TestFixedWindowAtTheFloor: on Redis time a fixed window keeps its end
// and count only (two fields), its key expiring at that end rounded up to
// the millisecond with no grace (CleanupGrace notwithstanding), a
// clock-aligned window's at its boundary; a denial writes nothing.
func TestFixedWindowAtTheFloor(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	var at int64
	s := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{ExtraTTL: time.Hour}), OnRedisTime: func(now int64) { at = now }}
	for _, aligned := range []bool{false, true} {
		p := policy(t, "floor", sluice.FixedWindow, 2, time.Minute)
		p.ClockAligned = aligned
		p.CleanupGrace = time.Hour
		subj := subject(t)
		key := s.Key(subj, p)
		st := mustEvaluate(t, s, subj, 1, p)
		end := at + st[0].ResetAfter.Microseconds()
		if aligned && end%time.Minute.Microseconds() != 0 {
			t.Fatalf("aligned: window ends at %d µs, want a minute's boundary", end)
		}
		raw, err := c.Get(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if v := stateFields(t, raw); len(v) != 2 || v[0] != end || v[1] != 1 {
			t.Fatalf("aligned %t: state %v, want {end %d, count 1}", aligned, v, end)
		}
		if exp := c.PExpireTime(ctx, key).Val().Milliseconds(); exp != (end+999)/1000 {
			t.Fatalf("aligned %t: key expires at %d ms, want the window's end %d µs rounded up: %d", aligned, exp, end, (end+999)/1000)
		}
		mustEvaluate(t, s, subj, 1, p)
		before := c.Dump(ctx, key).Val()
		if st := mustEvaluate(t, s, subj, 1, p); st[0].Allowed {
			t.Fatalf("aligned %t: third spend of 2 = %+v, want denied", aligned, st)
		}
		if after := c.Dump(ctx, key).Val(); after != before || c.PExpireTime(ctx, key).Val().Milliseconds() != (end+999)/1000 {
			t.Fatalf("aligned %t: a denial wrote: %q, then %q", aligned, before, after)
		}
	}
}
