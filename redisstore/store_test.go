package redisstore_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

func TestSuiteStandalone(t *testing.T) {
	c := standaloneClient(t)
	sluicetest.TestStore(t, func(t *testing.T, clock sluice.Clock) sluice.Store {
		return newStore(t, c, redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour})
	})
}

func TestSuiteCluster(t *testing.T) {
	c := clusterClient(t)
	sluicetest.TestStore(t, func(t *testing.T, clock sluice.Clock) sluice.Store {
		return newStore(t, c, redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour})
	})
}

// TestLostReplyIsReplayed: the proxy forwards the script call to Redis and
// drops the reply, so the decision is taken but the caller sees
// Indeterminate; the retry with the same evaluation id gets the first
// decision back and the budget shows one spend, not two.
func TestLostReplyIsReplayed(t *testing.T) {
	direct := standaloneClient(t)
	proxy := newBlackholeProxy(t, shared.standalone.Addr)
	pc := redis.NewClient(&redis.Options{Addr: proxy.addr, ContextTimeoutEnabled: true, MaxRetries: 3})
	defer pc.Close()
	// Long enough that a loaded machine never times out a call whose reply
	// comes; the dropped one waits it out.
	s := newStore(t, pc, redisstore.Options{Timeout: 2 * time.Second})
	p := policy(t, "lost", sluice.FixedWindow, 5, time.Minute)
	// Only Evaluate: the commands on the wire are counted (see decisionsOnly).
	l, err := sluice.New(decisionsOnly{s}, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	subj := subject(t)
	check := func(id string) sluice.Outcome {
		return l.Check(context.Background(), sluice.Request{Policy: "lost", Subject: subj, EvaluationID: id})
	}
	if o := check("warm-up"); o.Kind != sluice.Allowed || o.Remaining != 4 {
		t.Fatalf("warm-up = %+v, want allowed with 4 left", o)
	}
	proxy.dropReplies.Store(true)
	lost := check("job-1")
	proxy.dropReplies.Store(false)
	if lost.Kind != sluice.Indeterminate {
		t.Fatalf("Check whose reply was dropped = %+v, want Indeterminate", lost)
	}
	if n := proxy.forwardedWhileDropping.Load(); n != 1 {
		t.Fatalf("%d commands reached Redis while replies were dropped, want exactly the one script call", n)
	}
	retry := check("job-1")
	if retry.Kind != sluice.Allowed || !retry.Replayed || retry.Remaining != 3 {
		t.Fatalf("retry with the same id = %+v, want the first decision replayed: allowed, 3 left", retry)
	}
	again := l.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "lost", Subject: subj})
	if again.Remaining != 3 {
		t.Fatalf("remaining after a lost reply and its retry = %d, want 3: one spend, not two", again.Remaining)
	}
	// And directly in Redis: the counter holds the warm-up and job-1 (on
	// Redis time a fixed window keeps its end and count).
	if v, err := direct.Get(context.Background(), s.Key(subj, p)).Result(); err != nil || len(stateFields(t, v)) != 2 || stateFields(t, v)[1] != 2 {
		t.Fatalf("state in Redis = %q, %v; want a count of 2 (end, count)", v, err)
	}
}

// TestConcurrent: 40 goroutines on one key, Redis TIME, admit exactly the
// limit, for every algorithm.
func TestConcurrent(t *testing.T) {
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			const limit, callers = 10, 40
			p := policy(t, "conc", a, limit, time.Hour)
			subj := subject(t)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range callers {
				wg.Go(func() {
					<-start
					st, err := evaluate(context.Background(), s, subj, 1, p)
					if err != nil {
						t.Error(err)
						return
					}
					if st[0].Allowed {
						admitted.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if got := admitted.Load(); got != limit {
				t.Fatalf("%d concurrent callers: %d admitted, want exactly %d", callers, got, limit)
			}
		})
	}
}

// TestTwoProcesses: two OS processes sharing one Redis together admit
// exactly the limit.
func TestTwoProcesses(t *testing.T) {
	standaloneClient(t) // starts the shared server
	subj := subject(t)
	var outs [2]strings.Builder
	var cmds [2]*exec.Cmd
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+shared.standalone.Addr, "SLUICE_HELPER_SUBJECT="+subj, "SLUICE_HELPER_POLICY=procs")
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	total := 0
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v\n%s", i, err, outs[i].String())
		}
		var n int
		if _, err := fmt.Sscanf(outs[i].String(), "admitted %d", &n); err != nil {
			t.Fatalf("helper %d said %q: %v", i, outs[i].String(), err)
		}
		total += n
	}
	if total != helperLimit {
		t.Fatalf("two processes of %d calls each admitted %d together, want exactly the limit %d", helperCalls, total, helperLimit)
	}
}

// TestScriptFlush: after SCRIPT FLUSH the next decision loads the script
// again and succeeds, on a standalone server and on every cluster master.
// TestCodeFlushed: after FUNCTION FLUSH and SCRIPT FLUSH the next decision
// loads the code again where its key lives and is decided once.
func TestCodeFlushed(t *testing.T) {
	ctx := context.Background()
	flush := func(ctx context.Context, c *redis.Client) error {
		if err := c.FunctionFlush(ctx).Err(); err != nil {
			return err
		}
		return c.ScriptFlush(ctx).Err()
	}
	t.Run("standalone", func(t *testing.T) {
		c := standaloneClient(t)
		s := newStore(t, c, redisstore.Options{})
		p := policy(t, "flush", sluice.FixedWindow, 5, time.Minute)
		subj := subject(t)
		for i := range 3 {
			if err := flush(ctx, c); err != nil {
				t.Fatal(err)
			}
			if st := mustEvaluate(t, s, subj, 1, p); !st[0].Allowed || st[0].Remaining != int64(4-i) {
				t.Fatalf("decision %d after the flush = %+v, want allowed, remaining %d", i, st[0], 4-i)
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c := clusterClient(t)
		s := newStore(t, c, redisstore.Options{})
		p := policy(t, "flush", sluice.GCRA, 5, time.Minute)
		if err := c.ForEachMaster(ctx, flush); err != nil {
			t.Fatal(err)
		}
		for i := range 30 { // subjects spread over every master
			if st := mustEvaluate(t, s, fmt.Sprint(subject(t), i), 1, p); !st[0].Allowed || st[0].Remaining != 4 {
				t.Fatalf("first decision of subject %d after the flush = %+v, want allowed, remaining 4", i, st[0])
			}
		}
		if err := s.Ready(ctx); err != nil {
			t.Fatalf("Ready after reloads: %v", err)
		}
	})
}

func TestACL(t *testing.T) {
	ctx := context.Background()
	a := redistest.ACL(t, "sluice:")
	admin := a.AdminClient()
	defer admin.Close()
	user := a.UserClient()
	defer user.Close()
	s := newStore(t, user, redisstore.Options{})
	var ps []*sluice.Policy
	for _, alg := range algorithms {
		ps = append(ps, policy(t, "acl-"+alg.String(), alg, 3, time.Minute))
	}
	subj := subject(t)
	for i := range 4 {
		if i == 2 {
			if err := admin.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range ps {
			mustEvaluate(t, s, subj, 1, p)
		}
		st := mustEvaluate(t, s, subj, 0, ps...)
		if len(st) != len(ps) {
			t.Fatalf("multi-policy peek = %+v", st)
		}
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("Ready as the restricted user: %v", err)
	}
	// Every path of the script (dedupe records, refunds, deletes) runs
	// under the restricted user.
	sluicetest.TestStore(t, func(t *testing.T, clock sluice.Clock) sluice.Store {
		return newStore(t, user, redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour})
	})
	stats, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stats, "cmdstat_eval:") {
		t.Fatalf("INFO commandstats shows EVAL:\n%s", stats)
	}
	// Decisions went as FCALL: the decision code was never loaded as a
	// script (EVALSHA is the overrides' own small script, see
	// Store.PutOverride).
	if loaded, err := admin.ScriptExists(ctx, redisstore.ScriptSHA).Result(); err != nil || loaded[0] {
		t.Fatalf("SCRIPT EXISTS of the decision code = %v, %v: decisions went as EVALSHA where the user may load functions", loaded, err)
	}
	if !strings.Contains(stats, "cmdstat_fcall:") {
		t.Fatalf("INFO commandstats shows no FCALL:\n%s", stats)
	}
	// The user really is restricted: other keys and EVAL are refused.
	if err := user.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("EVAL as the restricted user = %v, want NOPERM", err)
	}
	s2, err := redisstore.New(user, redisstore.Options{Prefix: "other:"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = evaluate(ctx, s2, subj, 1, ps[0])
	if !errors.Is(err, sluice.FailedBeforeSend) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Evaluate on a prefix the user may not touch = %v, want NOPERM wrapped as FailedBeforeSend", err)
	}
}

// TestClusterMultiPolicy: every algorithm and all five together on a
// cluster, for subjects in every slot range: no CROSSSLOT, all or nothing.
// TestACLWithoutFunctions: a user allowed EVALSHA and SCRIPT LOAD but not
// FUNCTION LOAD or FCALL (an ACL written for scripts) is served by the
// script form of the same code.
func TestACLWithoutFunctions(t *testing.T) {
	ctx := context.Background()
	a := redistest.ACL(t, "sluice:")
	admin := a.AdminClient()
	defer admin.Close()
	rule := strings.NewReplacer("+fcall ", "", "+function|load ", "").Replace(redistest.ACLUser("sluice:"))
	if err := admin.Do(ctx, append([]any{"acl", "setuser", "scripts", "on", ">scripts-pw"}, splitRule(rule)...)...).Err(); err != nil {
		t.Fatal(err)
	}
	user := redis.NewClient(&redis.Options{Addr: a.Addr, Username: "scripts", Password: "scripts-pw"})
	defer user.Close()
	s := newStore(t, user, redisstore.Options{})
	p := policy(t, "scripts", sluice.TokenBucket, 3, time.Minute)
	subj := subject(t)
	// A store learns it at its first decision: FCALL refused, the
	// script loaded, the decision sent as EVALSHA.
	other := newStore(t, user, redisstore.Options{})
	if st := mustEvaluate(t, other, subject(t), 1, p); !st[0].Allowed {
		t.Fatalf("first decision of a new store = %+v, want allowed", st)
	}
	for i := range 3 {
		if i == 1 {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if st := mustEvaluate(t, s, subj, 1, p); !st[0].Allowed || st[0].Remaining != int64(2-i) {
			t.Fatalf("decision %d = %+v, want allowed with %d left", i, st[0], 2-i)
		}
	}
	stats, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	// The stores' first FCALLs were refused (rejected_calls), none ran.
	ranFCALL := strings.Contains(stats, "cmdstat_fcall:") && !strings.Contains(stats, "cmdstat_fcall:calls=0,")
	if !strings.Contains(stats, "cmdstat_evalsha:") || ranFCALL {
		t.Fatalf("INFO commandstats: want EVALSHA and no FCALL run:\n%s", stats)
	}
}

func splitRule(rule string) []any {
	var out []any
	for _, f := range strings.Fields(rule) {
		out = append(out, f)
	}
	return out
}

func TestClusterMultiPolicy(t *testing.T) {
	c := clusterClient(t)
	s := newStore(t, c, redisstore.Options{})
	var ps []*sluice.Policy
	for _, a := range algorithms {
		ps = append(ps, policy(t, "cl-"+a.String(), a, 2, time.Minute))
	}
	for i := range 50 {
		subj := fmt.Sprint(subject(t), i)
		for _, p := range ps {
			mustEvaluate(t, s, subj, 1, p)
		}
		st := mustEvaluate(t, s, subj, 1, ps...)
		for j := range st {
			if !st[j].Allowed {
				t.Fatalf("subject %d: second unit on all five = %+v, want all allowed", i, st)
			}
		}
		st = mustEvaluate(t, s, subj, 1, ps...)
		for j := range st {
			if st[j].Allowed || st[j].Remaining != 0 {
				t.Fatalf("subject %d: third unit on all five = %+v, want all denied", i, st)
			}
		}
	}
}

// TestEveryKeyHasTTL: after a random run, every key the store wrote has a
// positive PTTL.
func TestEveryKeyHasTTL(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	prefix := fmt.Sprintf("ttl%x:", rand.Uint32())
	s := newStore(t, c, redisstore.Options{Prefix: prefix})
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for i := range 500 {
		var ps []*sluice.Policy
		for j := range 1 + r.IntN(3) {
			ps = append(ps, randomPolicy(r, fmt.Sprint("t", j), algorithms[r.IntN(len(algorithms))]))
		}
		cost := randomCost(r, ps[0])
		for _, p := range ps {
			cost = min(cost, p.MaxCost)
		}
		mustEvaluate(t, s, fmt.Sprint("subj", i%37), cost, ps...)
	}
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("the random run wrote no key")
	}
	expired := 0
	for _, k := range keys {
		// -2 (gone) is fine: a key of a 1ms window may expire meanwhile.
		ttl, err := c.Do(ctx, "PTTL", k).Int64()
		switch {
		case err != nil || ttl == -1 || ttl < -2:
			t.Errorf("PTTL %s = %v, %v, want a TTL", k, ttl, err)
		case ttl == -2:
			expired++
		}
	}
	t.Logf("%d keys, all with a TTL (%d expired meanwhile)", len(keys), expired)
}

// TestCorruptState: state the script did not write is Unavailable
// (corrupt_state) with a reason, never silently reset, and nothing is
// written; a reset clears it.
func TestCorruptState(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	future := float64(time.Now().Add(400 * 24 * time.Hour).UnixMicro()) // beyond the longest window (365 days)
	for _, tc := range []struct {
		name string
		alg  sluice.Algorithm
		harm func(key string) error
		want string
	}{
		// On Redis time a fixed window keeps its end and count.
		{"not integers", sluice.FixedWindow, func(k string) error { return c.Set(ctx, k, "x", time.Hour).Err() }, "want 2 integers"},
		{"non-integer", sluice.FixedWindow, func(k string) error { return c.Set(ctx, k, "1:1.5", time.Hour).Err() }, "want 2 integers"},
		{"negative", sluice.GCRA, func(k string) error { return c.Set(ctx, k, "-3:0:1:1:1", time.Hour).Err() }, "want 5 integers"},
		{"leading zero", sluice.TokenBucket, func(k string) error { return c.Set(ctx, k, "1:01:1", time.Hour).Err() }, "want 3 integers"},
		{"above 2^53", sluice.TokenBucket, func(k string) error { return c.Set(ctx, k, "9007199254740993:1:1", time.Hour).Err() }, "want 3 integers"},
		{"missing field", sluice.SlidingWindow, func(k string) error { return c.Set(ctx, k, "1:2:3", time.Hour).Err() }, "want 4 integers"},
		{"hash", sluice.FixedWindow, func(k string) error { c.Del(ctx, k); return c.HSet(ctx, k, "c", "1").Err() }, "holds another type"},
		{"binary NaN", sluice.FixedWindow, setBinary(c, 1, math.NaN()), "field 2 = nan"},
		{"binary negative", sluice.GCRA, setBinary(c, 1, 0, 1, 1, -5), "field 5 = -5"},
		{"binary fraction", sluice.TokenBucket, setBinary(c, 1.5, 1, 1), "field 1 = 1.5"},
		{"binary above 2^53", sluice.SlidingWindow, setBinary(c, 1, 1, 1<<54, 1), "want an integer in [0, 2^53]"},
		{"binary too short", sluice.GCRA, setBinary(c, 1, 1, 1, 1), "want 5 integers"},
		{"written in 400 days", sluice.FixedWindow, setBinary(c, future, 1), "after the time of this call"},
		// Pushed after the entry written now: that one lies 400 days before
		// the newest (TestCorruptShapes has a lone entry ahead).
		{"log entry in 400 days", sluice.SlidingLog, func(k string) error { return c.RPush(ctx, k, int64(future)).Err() }, "want one in (newest - 365 days, newest]"},
		{"log not a list", sluice.SlidingLog, func(k string) error { return c.Set(ctx, k, "x", time.Hour).Err() }, "holds another type"},
		{"log entry", sluice.SlidingLog, func(k string) error { return c.RPush(ctx, k, "soon").Err() }, "entry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy(t, "corrupt", tc.alg, 5, time.Minute)
			other := policy(t, "fine", sluice.FixedWindow, 5, time.Minute)
			subj := subject(t)
			mustEvaluate(t, s, subj, 1, p, other)
			key := s.Key(subj, p)
			if err := tc.harm(key); err != nil {
				t.Fatal(err)
			}
			before, _ := c.Get(ctx, s.Key(subj, other)).Result()
			_, err := evaluate(ctx, s, subj, 1, other, p)
			if !errors.Is(err, sluice.CorruptState) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Evaluate over %s = %v, want CorruptState saying %q", tc.name, err, tc.want)
			}
			after, _ := c.Get(ctx, s.Key(subj, other)).Result()
			if before != after {
				t.Fatalf("the other policy's state changed from %v to %v: a failed decision wrote", before, after)
			}
			// Through a Limiter it is an Incompatible outcome.
			l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if o := l.Check(ctx, sluice.Request{Policy: "corrupt", Subject: subj}); o.Kind != sluice.Unavailable || o.Cause != sluice.CorruptState {
				t.Fatalf("Check over corrupt state = %+v, want Unavailable, corrupt_state: a server fault", o)
			}
			// An operator's way out: a reset deletes it, unread.
			if o := l.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: "corrupt", Subject: subj}); o.Kind != sluice.Allowed {
				t.Fatalf("Reset over corrupt state = %+v (err %v), want allowed", o, o.Err)
			}
			if o := l.Check(ctx, sluice.Request{Policy: "corrupt", Subject: subj}); o.Kind != sluice.Allowed || o.Remaining != 4 {
				t.Fatalf("Check after the reset = %+v (err %v), want allowed with 4 left", o, o.Err)
			}
		})
	}
}

// TestStateWithoutTTLGetsOne: the script reads state without asking for
// its TTL; a key that lost it (PERSIST by hand) is given one again by the
// next write. A fixed window on Redis time (the default) gets its TTL
// when its window opens, at its end, and a spend in a window that goes on
// keeps whatever TTL the key has (SETRANGE of its count, issue 31's floor): such
// a key gets one again from the next window its subject opens.
func TestStateWithoutTTLGetsOne(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	for _, alg := range algorithms {
		p := policy(t, "persisted", alg, 5, time.Minute)
		subj := subject(t)
		mustEvaluate(t, s, subj, 1, p)
		key := s.Key(subj, p)
		if err := c.Persist(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		if st := mustEvaluate(t, s, subj, 1, p); !st[0].Allowed || st[0].Remaining != 3 {
			t.Fatalf("%v: second spend over a key without TTL = %+v, want allowed with 3 left", alg, st)
		}
		ttl, err := c.PTTL(ctx, key).Result()
		if alg != sluice.FixedWindow {
			if err != nil || ttl <= 0 {
				t.Fatalf("%v: PTTL after the write = %v, %v; want a TTL again", alg, ttl, err)
			}
			continue
		}
		if err != nil || ttl != -time.Nanosecond {
			t.Fatalf("%v: PTTL after a spend in the window that goes on = %v, %v; want none kept (SETRANGE)", alg, ttl, err)
		}
		// The window ended (its end 1 µs after the epoch), still without a TTL.
		if err := c.Set(ctx, key, binaryState(1, 2), 0).Err(); err != nil {
			t.Fatal(err)
		}
		if st := mustEvaluate(t, s, subj, 1, p); !st[0].Allowed || st[0].Remaining != 4 {
			t.Fatalf("%v: spend after the window ended = %+v, want allowed with 4 left", alg, st)
		}
		if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > time.Minute+time.Millisecond {
			t.Fatalf("%v: PTTL after the spend that opened a window = %v, %v; want at most the window, 1m, rounded up to the ms", alg, ttl, err)
		}
	}
}

// TestClockUnsafe: in caller-clock mode a caller further behind the newest
// write than MaxClockRegression is refused and changes nothing; within the
// bound the earlier time counts as the later one.
func TestClockUnsafe(t *testing.T) {
	c := standaloneClient(t)
	clock := sluicetest.NewClock()
	s := newStore(t, c, redisstore.Options{Clock: clock, MaxClockRegression: time.Second})
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			p := policy(t, "clock", a, 5, time.Minute)
			subj := subject(t)
			clock.Set(clockStart)
			mustEvaluate(t, s, subj, 2, p)
			clock.Set(clockStart.Add(-999 * time.Millisecond))
			st := mustEvaluate(t, s, subj, 1, p)
			if !st[0].Allowed || st[0].Remaining > 2 {
				// gcra counts an earlier now as a longer debt: fewer remain.
				t.Fatalf("within the bound = %+v, want allowed, remaining at most 2", st[0])
			}
			clock.Set(clockStart.Add(-1001 * time.Millisecond))
			_, err := evaluate(context.Background(), s, subj, 1, p)
			if !errors.Is(err, sluice.ClockUnsafe) {
				t.Fatalf("1.001s behind = %v, want ClockUnsafe", err)
			}
			clock.Set(clockStart)
			before := mustEvaluate(t, s, subj, 0, p)[0]
			clock.Set(clockStart.Add(-1001 * time.Millisecond))
			if _, err := evaluate(context.Background(), s, subj, 1, p); !errors.Is(err, sluice.ClockUnsafe) {
				t.Fatalf("1.001s behind again = %v, want ClockUnsafe", err)
			}
			clock.Set(clockStart)
			if after := mustEvaluate(t, s, subj, 0, p)[0]; after != before {
				t.Fatalf("peek after the refused call = %+v, want %+v (nothing spent)", after, before)
			}
		})
	}
}

// TestDoneContext: a context already done returns its error, bare, and
// sends nothing.
func TestDoneContext(t *testing.T) {
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := evaluate(ctx, s, subject(t), 1, policy(t, "done", sluice.FixedWindow, 1, time.Minute))
	if err != context.Canceled {
		t.Fatalf("Evaluate with a canceled context = %v, want context.Canceled itself", err)
	}
}

// TestStoppedServer: with the server gone, the decision fails before send.
func TestStoppedServer(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	s := newStore(t, c, redisstore.Options{})
	p := policy(t, "stopped", sluice.FixedWindow, 5, time.Minute)
	subj := subject(t)
	mustEvaluate(t, s, subj, 1, p)
	srv.Stop()
	for i := range 3 {
		_, err := evaluate(context.Background(), s, subj, 1, p)
		if !errors.Is(err, sluice.FailedBeforeSend) {
			t.Fatalf("call %d to a stopped server = %v, want FailedBeforeSend", i, err)
		}
	}
	if err := s.Ready(context.Background()); err == nil {
		t.Fatal("Ready with the server stopped = nil, want an error")
	}
}

// TestNoReply: a peer that accepts the command and never answers yields
// ErrIndeterminate within the store's timeout.
func TestNoReply(t *testing.T) {
	standaloneClient(t) // starts the shared server
	proxy := newBlackholeProxy(t, shared.standalone.Addr)
	pc := redis.NewClient(&redis.Options{Addr: proxy.addr, ContextTimeoutEnabled: true, MaxRetries: 3})
	defer pc.Close()
	const timeout = 2 * time.Second // generous: the warm-up call must not time out on a loaded machine
	s := newStore(t, pc, redisstore.Options{Timeout: timeout})
	p := policy(t, "noreply", sluice.FixedWindow, 5, time.Minute)
	subj := subject(t)
	mustEvaluate(t, s, subj, 1, p) // the connection is up, the script loaded
	// The Limiter sees only Evaluate: over an OverrideStore it would also
	// read overrides in the background, a command this test would count.
	l, err := sluice.New(decisionsOnly{s}, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	proxy.swallow.Store(true)
	// The caller's context has no deadline and the peer never answers:
	// only the store's timeout can end the wait, so an answer at all is
	// the timeout at work.
	o := l.Check(context.Background(), sluice.Request{Policy: "noreply", Subject: subj})
	if o.Kind != sluice.Indeterminate || !errors.Is(o.Err, sluice.ErrIndeterminate) {
		t.Fatalf("Check with no reply = %+v, want Indeterminate wrapping ErrIndeterminate", o)
	}
	if n := proxy.swallowed.Load(); n != 1 {
		t.Fatalf("the peer received %d commands, want 1: go-redis must not resend a script call", n)
	}
}

// blackholeProxy forwards to a Redis server until swallow is set; from then
// on it accepts and reads commands but never answers.
type blackholeProxy struct {
	addr      string
	swallow   atomic.Bool
	swallowed atomic.Int64 // commands received while swallowing
	// dropReplies forwards commands but throws Redis's replies away.
	dropReplies            atomic.Bool
	forwardedWhileDropping atomic.Int64
}

func newBlackholeProxy(t *testing.T, upstream string) *blackholeProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackholeProxy{addr: l.Addr().String()}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	conns.Go(func() {
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			mu.Lock()
			open = append(open, down, up)
			mu.Unlock()
			conns.Go(func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 && !p.dropReplies.Load() {
						if _, err := down.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
			conns.Go(func() {
				rd := bufio.NewReader(down)
				for {
					// Read one RESP array command: *N then N bulk strings.
					line, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
					cmd := []byte(line)
					for range n {
						head, err := rd.ReadString('\n')
						if err != nil {
							return
						}
						size, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
						body := make([]byte, size+2)
						if _, err := io.ReadFull(rd, body); err != nil {
							return
						}
						cmd = append(append(cmd, head...), body...)
					}
					if p.swallow.Load() {
						p.swallowed.Add(1)
						continue
					}
					if p.dropReplies.Load() {
						p.forwardedWhileDropping.Add(1)
					}
					if _, err := up.Write(cmd); err != nil {
						return
					}
				}
			})
		}
	})
	return p
}

// TestDedupeForgetsManyIDsAtOnce: thousands of remembered ids expiring
// together (Lua's unpack fails on a few thousand values) are forgotten in
// the same call that remembers the next one, which still replays.
func TestDedupeForgetsManyIDsAtOnce(t *testing.T) {
	c := standaloneClient(t)
	s, clock := callerStore(t, c)
	p := policy(t, "many", sluice.GCRA, 1_000_000, time.Second)
	p.DedupeMax = 10_000
	subj := subject(t)
	// Remember 9000 ids through the store, so the records are the script's own.
	for i := range 9000 {
		ev := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, Cost: 1, EvaluationID: fmt.Sprint("id-", i)}
		if err := s.Evaluate(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(p.DedupeTTL)
	ev := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, Cost: 1, EvaluationID: "after"}
	if err := s.Evaluate(context.Background(), ev); err != nil {
		t.Fatalf("the decision that forgets 9000 expired ids: %v", err)
	}
	again := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, Cost: 1, EvaluationID: "after"}
	if err := s.Evaluate(context.Background(), again); err != nil || !again.Replayed {
		t.Fatalf("retry = replayed %v, err %v; want replayed", again.Replayed, err)
	}
	n, err := c.HLen(context.Background(), "sluice:{"+subj+"}many:1:idv").Result()
	if err != nil || n != 1 {
		t.Fatalf("remembered replies = %d, %v; want 1 (the 9000 expired ones forgotten)", n, err)
	}
}

// stateFields decodes a fixed-size state as the script stores it.
func stateFields(t *testing.T, raw string) []int64 {
	t.Helper()
	if len(raw) < 1 || raw[0] != redisstore.StateBinary || (len(raw)-1)%8 != 0 {
		t.Fatalf("state %q: not the script's binary form", raw)
	}
	var v []int64
	for b := []byte(raw[1:]); len(b) > 0; b = b[8:] {
		v = append(v, int64(math.Float64frombits(binary.LittleEndian.Uint64(b))))
	}
	return v
}

// setBinary returns a function that stores fields at a key in the
// script's binary form, whatever they hold.
func setBinary(c *redis.Client, fields ...float64) func(key string) error {
	return func(key string) error {
		return c.Set(context.Background(), key, binaryState(fields...), time.Hour).Err()
	}
}

// binaryState is the stored form of a fixed-size state of fields.
func binaryState(fields ...float64) []byte {
	b := []byte{redisstore.StateBinary}
	for _, f := range fields {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	return b
}

// TestDecimalStateIsRead: state an older version kept as decimals joined
// by ':' is read as it was meant, and the next write stores it in the
// binary form: upgrading resets no budget. (The record of a fixed window
// on the caller's clock; on Redis time it keeps another, binary only.)
func TestDecimalStateIsRead(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{Clock: sluicetest.NewClock()})
	p := policy(t, "decimal", sluice.FixedWindow, 5, time.Minute)
	subj := subject(t)
	mustEvaluate(t, s, subj, 1, p)
	key := s.Key(subj, p)
	raw, err := c.Get(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	v := stateFields(t, raw)
	decimal := fmt.Sprintf("%d:%d:%d", v[0], 3, v[2])
	if err := c.Set(ctx, key, decimal, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if st := mustEvaluate(t, s, subj, 1, p); !st[0].Allowed || st[0].Remaining != 1 {
		t.Fatalf("spend over the decimal state %q = %+v, want allowed with 1 left (4 spent)", decimal, st)
	}
	raw, err = c.Get(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if v := stateFields(t, raw); v[1] != 4 {
		t.Fatalf("state after the write = %v, want a count of 4 in the binary form", v)
	}
}
