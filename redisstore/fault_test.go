package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/faultproxy"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The fault tests put real Redis processes (and the fault proxy between
// them and the store) into each failure of issue 10 while workers send
// decisions, then bring Redis back. One harness serves them all (and the
// per-master failover test, hang_test.go): startLoad or newRun, inject
// with the fault, check. For each fault they hold:
//
//   - the fault lasts until it has shown (its until: the breaker shed,
//     a reply was lost, …), not for a set time;
//   - nothing waits on a dead Redis: where Redis answers nothing while
//     broken (quiet), the load is drained before Redis is back, so every
//     decision begun during the fault was answered without Redis (the
//     store's Timeout and the caller's deadline end them);
//   - every answer is typed as the fault allows: Allowed, Unavailable
//     with the cause the fault explains, or Indeterminate;
//   - nothing is spent twice: each decision whose reply was lost is
//     retried with its evaluation id, and the budget spent equals the
//     decisions allowed, exactly;
//   - no goroutine outlives the store, its client and the proxy;
//   - decisions are allowed again once Redis is back (faultStreak in a
//     row per worker).
//
// Each logs its figures (answers, worst latency, outcomes, time to
// recover, replays, over-admissions), measured, never asserted;
// RELIABILITY.md quotes them:
//
//	go test ./redisstore -run 'TestFault' -v -count=1
const (
	faultDeadline  = time.Second            // each decision's context deadline
	faultTimeout   = 500 * time.Millisecond // the store's Timeout per round trip
	faultWorkers   = 6
	faultPace      = 5 * time.Millisecond // between one worker's decisions
	faultLimit     = 1_000_000            // never reached: every decision Redis takes is allowed
	faultStreak    = 20                   // allowed decisions in a row, per worker, that mean recovered
	faultShed      = 20                   // decisions shed by the breaker that show it opened
	faultRunBudget = 30 * time.Second     // the most one phase waits for its event: a bound, not a threshold
)

// checkLeaks fails the test if, once its cleanups have run, more
// goroutines remain than when it began. Call it first, so its cleanup
// runs last.
func checkLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		var now int
		for range 100 { // go-redis's dial probe sleeps 1s between looks at a closed pool
			if now = runtime.NumGoroutine(); now <= before {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after the cleanups:\n%s", before, now, buf[:runtime.Stack(buf, true)])
	})
}

// faultPolicy has a limit never reached, so every decision Redis takes is
// allowed and the budget spent counts them; ids are remembered an hour.
func faultPolicy(t testing.TB, id string) sluice.Policy {
	p := policy(t, id, sluice.FixedWindow, faultLimit, time.Hour)
	p.DedupeTTL, p.DedupeMax = time.Hour, 10_000
	return *p
}

// answer is how one decision was answered.
type answer struct {
	worker int
	id     string
	start  time.Time
	took   time.Duration
	o      sluice.Outcome
}

// faultRun is one fault test's traffic and what became of it.
type faultRun struct {
	t        *testing.T
	l        *sluice.Limiter
	policy   string
	subjects []string // one per worker

	mu      sync.Mutex
	answers []answer
	broken  time.Time // when the fault was set
	healed  time.Time // when Redis was back
	// failover: the fault may lose writes Redis acknowledged (a replica
	// promoted before it had them), so less may be spent than allowed.
	failover bool
	stop     chan struct{}
	wg       sync.WaitGroup
	seq      atomic.Int64 // evaluation ids, unique over the run
}

// newRun returns a run of l's policy on subjects, one worker each; load
// starts it.
func newRun(t *testing.T, l *sluice.Limiter, policy string, subjects []string) *faultRun {
	return &faultRun{t: t, l: l, policy: policy, subjects: subjects}
}

// startLoad starts faultWorkers workers, each on a subject of its own.
func startLoad(t *testing.T, l *sluice.Limiter, policy string) *faultRun {
	var subjects []string
	for w := range faultWorkers {
		subjects = append(subjects, fmt.Sprintf("%s.w%d", subject(t), w))
	}
	r := newRun(t, l, policy, subjects)
	r.load()
	return r
}

// load starts the workers: each sends decisions on its subject, each
// with an evaluation id of its own, until drain.
func (r *faultRun) load() {
	r.stop = make(chan struct{})
	for w := range r.subjects {
		r.wg.Go(func() {
			for {
				select {
				case <-r.stop:
					return
				case <-time.After(faultPace): // pace, not order
				}
				id := fmt.Sprintf("w%d-%d", w, r.seq.Add(1))
				ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
				start := time.Now()
				o := r.l.Check(ctx, sluice.Request{Policy: r.policy, Subject: r.subjects[w], EvaluationID: id})
				took := time.Since(start)
				cancel()
				r.mu.Lock()
				r.answers = append(r.answers, answer{w, id, start, took, o})
				r.mu.Unlock()
			}
		})
	}
}

// drain stops the workers and waits for the decisions they have in
// flight, at most faultRunBudget: a decision still waiting then waits on
// Redis, past anything its caller allowed.
func (r *faultRun) drain(what string) {
	r.t.Helper()
	close(r.stop)
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(faultRunBudget):
		r.t.Fatalf("decisions still unanswered %v after the load stopped %s: they wait on Redis", faultRunBudget, what)
	}
}

// waitFor polls cond over the outcomes (kind/cause → count) of the
// decisions begun since from, a bounded number of times.
func (r *faultRun) waitFor(what string, from time.Time, cond func(kinds map[string]int, streak int) bool) {
	r.t.Helper()
	for deadline := time.Now().Add(faultRunBudget); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		r.mu.Lock()
		kinds := map[string]int{}
		streak := make([]int, len(r.subjects))
		for _, a := range r.answers {
			if a.start.Before(from) {
				continue
			}
			kinds[a.o.Kind.String()+"/"+a.o.Cause.String()]++
			if streak[a.worker]++; a.o.Kind != sluice.Allowed {
				streak[a.worker] = 0
			}
		}
		r.mu.Unlock()
		if cond(kinds, slices.Min(streak)) {
			return
		}
	}
	r.t.Fatalf("%s: not within %v", what, faultRunBudget)
}

// fault is one way to break Redis, and how to tell it has shown.
type fault struct {
	breakIt func() // nil: Redis is down from the start, no warm-up
	heal    func() // Redis is back when it returns
	// until says, from the outcomes of the decisions begun since the
	// break, that the fault has shown; nil: heal at once.
	until func(kinds map[string]int) bool
	// quiet: Redis answers nothing while broken, so the load is drained
	// before heal: every decision begun in the fault was answered
	// without Redis.
	quiet bool
}

// shed is an until: the breaker has shed faultShed decisions.
func shed(kinds map[string]int) bool { return kinds["unavailable/circuit_open"] >= faultShed }

// inject runs the workers through f: warm up, break, hold until the
// fault has shown, heal, then on until every worker is allowed again,
// and stop.
func (r *faultRun) inject(f fault) {
	t := r.t
	t.Helper()
	if f.breakIt != nil {
		r.waitFor("warm-up", time.Time{}, func(_ map[string]int, streak int) bool { return streak >= 5 })
		f.breakIt()
	}
	r.mu.Lock()
	r.broken = time.Now()
	r.mu.Unlock()
	if f.until != nil {
		r.waitFor("the fault showing", r.broken, func(kinds map[string]int, _ int) bool { return f.until(kinds) })
	}
	if f.quiet {
		r.drain("while Redis was broken")
	}
	f.heal()
	r.mu.Lock()
	r.healed = time.Now()
	r.mu.Unlock()
	if f.quiet {
		r.load()
	}
	r.waitFor("every worker allowed again", r.healed, func(_ map[string]int, streak int) bool { return streak >= faultStreak })
	r.drain("after Redis was back")
}

// faultFigures is what a fault test measured.
type faultFigures struct {
	answers       int
	maxLatency    time.Duration
	maxShed       time.Duration  // the slowest answer the breaker shed (circuit_open)
	kinds         map[string]int // kind/cause → count
	recovery      time.Duration  // from Redis back to the first of the final all-allowed answers
	lost, replays int            // Indeterminate decisions retried; retries that replayed a decision
	spent, want   int64          // budget spent, decisions allowed: want − spent were admitted uncounted
}

func (f faultFigures) String() string {
	keys := make([]string, 0, len(f.kinds))
	for k := range f.kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var kinds []string
	for _, k := range keys {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, f.kinds[k]))
	}
	return fmt.Sprintf("%d answers, max latency %v (shed by the breaker: %v); outcomes: %s; recovered %v after Redis was back; %d lost replies retried, %d replayed; spent %d for %d allowed (over-admissions %d)",
		f.answers, f.maxLatency.Round(time.Millisecond), f.maxShed.Round(10*time.Microsecond), strings.Join(kinds, ", "),
		f.recovery.Round(time.Millisecond), f.lost, f.replays, f.spent, f.want, f.want-f.spent)
}

// check holds the run to the promises above. allowed lists the outcome
// kinds the fault may give ("indeterminate/", "unavailable/circuit_open",
// …) besides "allowed/".
func (r *faultRun) check(name string, allowed ...string) faultFigures {
	t := r.t
	t.Helper()
	r.mu.Lock()
	answers := slices.Clone(r.answers)
	healed := r.healed
	r.mu.Unlock()
	sort.Slice(answers, func(i, j int) bool { return answers[i].start.Before(answers[j].start) })
	f := faultFigures{answers: len(answers), kinds: map[string]int{}}
	allowed = append(allowed, "allowed/")
	recoveredAt := healed
	for _, a := range answers {
		k := a.o.Kind.String() + "/" + a.o.Cause.String()
		f.kinds[k]++
		f.maxLatency = max(f.maxLatency, a.took)
		if a.o.Cause == sluice.CircuitOpen {
			f.maxShed = max(f.maxShed, a.took)
		}
		if !slices.Contains(allowed, k) {
			t.Errorf("%s: decision %s = %s (%v), want one of %v", name, a.id, k, a.o.Err, allowed)
		}
		if a.o.Kind != sluice.Allowed && a.o.Err == nil {
			t.Errorf("%s: decision %s = %+v: a non-decision without its error", name, a.id, a.o)
		}
		if a.o.Kind != sluice.Allowed && !a.start.Before(recoveredAt) {
			recoveredAt = a.start.Add(a.took)
		}
	}
	f.recovery = recoveredAt.Sub(healed)
	// Nothing spent twice: retry every lost reply with its id; each is
	// allowed (replayed if Redis had taken it), and the budget spent is
	// exactly the decisions allowed.
	allowedBy := make([]int64, faultWorkers)
	for _, a := range answers {
		switch a.o.Kind {
		case sluice.Allowed:
			allowedBy[a.worker]++
		case sluice.Indeterminate:
			f.lost++
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			o := r.l.Check(ctx, sluice.Request{Policy: r.policy, Subject: r.subjects[a.worker], EvaluationID: a.id})
			cancel()
			if o.Kind != sluice.Allowed {
				t.Errorf("%s: retry of lost decision %s = %+v, want allowed", name, a.id, o)
				continue
			}
			if o.Replayed {
				f.replays++
			}
			allowedBy[a.worker]++
		}
	}
	for w, subj := range r.subjects {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		o := r.l.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: r.policy, Subject: subj})
		cancel()
		if o.Kind != sluice.Allowed {
			t.Fatalf("%s: peek of worker %d = %+v", name, w, o)
		}
		spent := faultLimit - o.Remaining
		f.spent += spent
		f.want += allowedBy[w]
		if spent < allowedBy[w] && r.failover {
			t.Logf("%s: worker %d spent %d for %d decisions allowed: %d writes acknowledged and then lost with the master", name, w, spent, allowedBy[w], allowedBy[w]-spent)
		}
		if spent > allowedBy[w] || spent < allowedBy[w] && !r.failover {
			t.Errorf("%s: worker %d spent %d for %d decisions allowed (lost replies retried): want equal, each spent once", name, w, spent, allowedBy[w])
		}
	}
	t.Logf("%s: %v", name, f)
	return f
}

// faultStore returns a limiter over a store over c, with the fault tests'
// timeout and default breaker, and the policy "fault".
func faultStore(t *testing.T, c redis.UniversalClient, opts redisstore.Options) *sluice.Limiter {
	t.Helper()
	opts.Timeout = faultTimeout
	l, _, _ := faultLimiter(t, c, opts, "fault")
	return l
}

// faultLimiter returns a limiter with the policy id (faultPolicy) over a
// store over c with opts, and the breaker states the store went through.
func faultLimiter(t *testing.T, c redis.UniversalClient, opts redisstore.Options, id string) (*sluice.Limiter, *redisstore.Store, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var states []string
	opts.Breaker.OnChange = func(s string) { mu.Lock(); states = append(states, s); mu.Unlock() }
	s := newStore(t, c, opts)
	l, err := sluice.New(s, []sluice.Policy{faultPolicy(t, id)}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l, s, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(states) }
}

// faultClient is a client as an application would make one: context
// deadlines on the socket, go-redis's defaults otherwise.
func faultClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
}

// TestFaultKilled: Redis is killed (SIGKILL) under load and restarted
// once the breaker has shed, with its append-only file synced on every write, as a
// Redis that keeps its data does. In-flight decisions are Indeterminate,
// later ones fail before send until the breaker opens.
func TestFaultKilled(t *testing.T) {
	checkLeaks(t)
	srv, err := redistest.StartServer(t.TempDir(), "appendonly yes", "appendfsync always")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c := faultClient(srv.Addr)
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})
	r := startLoad(t, l, "fault")
	r.inject(fault{breakIt: srv.Kill, heal: func() {
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	}, until: shed, quiet: true})
	r.check("killed", "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
}

// TestFaultStartsWithoutRedis: a store is built while Redis is
// down and decisions are asked at once; they fail before send (nothing
// spent) or are shed by the breaker, each without Redis, until Redis
// starts, once some failed before send and the breaker has shed; then
// they are taken.
func TestFaultStartsWithoutRedis(t *testing.T) {
	checkLeaks(t)
	srv := redistest.Standalone(t)
	srv.Kill()
	c := faultClient(srv.Addr)
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})
	r := startLoad(t, l, "fault")
	r.inject(fault{heal: func() {
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	}, until: func(kinds map[string]int) bool {
		return kinds["unavailable/failed_before_send"] > 0 && shed(kinds)
	}, quiet: true})
	// A pipeline of decisions whose connection was still being dialled
	// when the store's timeout ended it is Indeterminate: batch.go types
	// every pipeline cut short by its deadline so, sent or not. Nothing
	// ran, and the retries show it (none replays).
	f := r.check("started without Redis", "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
	if f.kinds["allowed/"] == 0 || f.kinds["unavailable/failed_before_send"] == 0 {
		t.Errorf("%v: want failures before send, then decisions taken", f)
	}
}

// TestFaultHung: Redis is stopped (SIGSTOP) until the breaker has shed:
// it keeps its connections and answers nothing. The first decisions wait out the
// store's timeout; then the breaker sheds at once; after SIGCONT the
// decisions held in the socket run, and their retries replay them.
func TestFaultHung(t *testing.T) {
	checkLeaks(t)
	srv := redistest.Standalone(t)
	c := faultClient(srv.Addr)
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})
	r := startLoad(t, l, "fault")
	pause, resume := func() {
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	r.inject(fault{breakIt: pause, heal: resume, until: shed, quiet: true})
	r.check("hung (SIGSTOP)", "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
}

// TestFaultBlackhole: until the breaker has shed, a listener that
// accepts connections and never answers, and whose connections then carry nothing either way: new
// connections cannot even be set up. Bytes held are dropped with the
// connections when the fault clears, so nothing the store sent runs.
func TestFaultBlackhole(t *testing.T) {
	checkLeaks(t)
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := faultClient(p.Addr())
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})
	r := startLoad(t, l, "fault")
	r.inject(fault{breakIt: func() { p.Hang(); p.Drop() }, heal: func() { p.Drop(); p.Forward() }, until: shed, quiet: true})
	r.check("accepts, never answers", "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
}

// TestFaultLatency: 50ms added each way is only slower: every decision is
// taken. Then 1s each way until the breaker has shed, past the store's timeout: the decisions are
// Indeterminate (they reach Redis late and run), the breaker opens, and
// their retries replay them.
func TestFaultLatency(t *testing.T) {
	checkLeaks(t)
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := faultClient(p.Addr())
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})

	r := startLoad(t, l, "fault")
	delayed := p.Delayed()
	// Held until every worker has had 5 decisions begun under the
	// latency, and the proxy has delayed chunks (its sign the latency
	// took effect).
	r.inject(fault{breakIt: func() { p.SetLatency(50 * time.Millisecond) }, heal: func() { p.SetLatency(0) }, until: func(kinds map[string]int) bool {
		return kinds["allowed/"] >= 5*faultWorkers && p.Delayed() > delayed
	}})
	r.check("50ms latency each way")

	r = startLoad(t, l, "fault")
	// Clearing the latency delivers the chunks the proxy was delaying at
	// once: recovery is from then.
	r.inject(fault{breakIt: func() { p.SetLatency(time.Second) }, heal: func() { p.SetLatency(0) }, until: shed})
	r.check("1s latency each way", "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
}

// TestFaultResetAfterWrite: the connection is reset when Redis's reply
// comes (the decision ran, its answer is lost), then reset after the
// first bytes of a command (it never ran). Both are Indeterminate: the
// store cannot tell which; the retries tell, replaying the first kind.
func TestFaultResetAfterWrite(t *testing.T) {
	checkLeaks(t)
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := faultClient(p.Addr())
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})
	for _, tc := range []struct {
		name string
		set  func()
	}{
		{"reset when the reply comes", p.ResetOnReply},
		{"reset after 10 bytes of the command", func() { p.ResetAfter(10) }},
	} {
		r := startLoad(t, l, "fault")
		r.inject(fault{breakIt: tc.set, heal: p.Forward, until: func(kinds map[string]int) bool { return kinds["indeterminate/"] > 0 && shed(kinds) }})
		f := r.check(tc.name, "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
		if f.lost == 0 {
			t.Errorf("%s: no decision was Indeterminate", tc.name)
		}
	}
}

// TestFaultRefused: Redis refuses writes, read-only (made a replica) or
// out of memory. The script never runs: each decision is Unavailable with
// Redis's code in its reason (failed before send, nothing spent) or, once
// the breaker has opened, circuit_open; never Indeterminate.
func TestFaultRefused(t *testing.T) {
	checkLeaks(t)
	srv := redistest.Standalone(t)
	admin := srv.Client()
	t.Cleanup(func() { admin.Close() })
	c := faultClient(srv.Addr)
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})
	ctx := context.Background()
	do := func(args ...any) func() {
		return func() {
			if err := admin.Do(ctx, args...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name, code string
		set, heal  func()
	}{
		{"READONLY", "READONLY", do("replicaof", "127.0.0.1", "1"), do("replicaof", "no", "one")},
		{"OOM", "OOM", do("config", "set", "maxmemory", "1"), do("config", "set", "maxmemory", "0")},
	} {
		r := startLoad(t, l, "fault")
		r.inject(fault{breakIt: tc.set, heal: tc.heal, until: func(kinds map[string]int) bool {
			return kinds["unavailable/failed_before_send"] > 0 && shed(kinds)
		}})
		f := r.check(tc.name, "unavailable/failed_before_send", "unavailable/circuit_open")
		if f.lost != 0 || f.kinds["unavailable/failed_before_send"] == 0 {
			t.Errorf("%s: %v; want some failed before send and none Indeterminate", tc.name, f)
		}
		for _, a := range r.answers {
			if a.o.Cause == sluice.FailedBeforeSend && !strings.Contains(fmt.Sprint(a.o.Err), tc.code) {
				t.Errorf("%s: decision %s failed before send: %q, want Redis's code %s", tc.name, a.id, a.o.Err, tc.code)
				break
			}
		}
	}
}

// TestFaultClusterFailover: in a Redis Cluster of three masters with a
// replica each, the master serving the first worker's subject is killed;
// its replica is promoted (cluster-node-timeout 1s) and takes over its
// slots. Until then the cluster refuses (CLUSTERDOWN) or the dead master
// does not answer: decisions fail typed; once the replica is master,
// decisions are taken there again. Replication is asynchronous, so a
// write acknowledged just before the kill could be lost with it: those
// would be over-admissions, counted, never a decision spent twice.
func TestFaultClusterFailover(t *testing.T) {
	redistest.Long(t)
	checkLeaks(t)
	cluster, err := redistest.StartCluster(3, 1, "cluster-node-timeout 1000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{})
	r := startLoad(t, l, "fault")
	r.failover = true
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	master, err := c.MasterForKey(ctx, "{"+r.subjects[0]+"}")
	if err != nil {
		t.Fatal(err)
	}
	dead := master.Options().Addr
	replica, err := cluster.ReplicaOf(ctx, dead)
	if err != nil {
		t.Fatal(err)
	}
	var victim *redistest.Server
	for _, m := range cluster.Masters {
		if m.Addr == dead {
			victim = m
		}
	}
	if victim == nil {
		t.Fatalf("master %s of %s is not one the cluster started", dead, r.subjects[0])
	}
	var killed time.Time
	r.inject(fault{breakIt: func() { victim.Kill(); killed = time.Now() }, heal: func() {
		if err := cluster.WaitPromoted(ctx, replica, dead); err != nil {
			t.Fatal(err)
		}
		t.Logf("replica %s promoted %v after its master was killed", replica.Addr, time.Since(killed).Round(time.Millisecond))
	}})
	r.check("cluster master killed, replica promoted", "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
}
