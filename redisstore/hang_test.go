package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/faultproxy"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The hang tests hold the store to the acceptance criteria of the breaker
// issue, with checks that arrive one after another, each with the
// server's 500ms decision deadline (shorter than the store's default 1s
// Timeout): every answer before the breaker opens is one that waited for
// Redis and was cut off, the breaker opens after exactly its configured
// number of failures, and from then on every answer is shed at once: it
// comes while its deadline has not yet passed, so it waited for nothing.
// They assert no duration; the latencies are logged.
const (
	hangDeadline = 500 * time.Millisecond
	hangFailures = 5 // the default BreakerOptions.Failures
	hangShed     = 10
)

// timed is one check's outcome, how long it took (logged), and whether
// it came before its deadline had passed.
type timed struct {
	o     sluice.Outcome
	took  time.Duration
	early bool
}

func (a timed) String() string {
	return fmt.Sprintf("%s/%s in %v", a.o.Kind, a.o.Cause, a.took.Round(100*time.Microsecond))
}

// checkTimed runs one check of subj with the hang tests' deadline.
func checkTimed(l *sluice.Limiter, policy, subj string) timed {
	ctx, cancel := context.WithTimeout(context.Background(), hangDeadline)
	defer cancel()
	start := time.Now()
	o := l.Check(ctx, sluice.Request{Policy: policy, Subject: subj})
	return timed{o, time.Since(start), ctx.Err() == nil}
}

// holdsOpening asserts the criteria on answers, sequential checks of a
// Redis that hangs: at most failures answers that waited (each within the
// deadline + margin, typed as a failure for want of Redis: Indeterminate
// when written, failed before send when not, or deadline_passed for a
// check that waited for the Limiter's stale overrides, whose read failed
// by its deadline and counts towards the breaker too), then circuit_open
// answers, each before its deadline had passed: Redis hangs, so an
// answer that came that soon waited for nothing (the first shed may
// have read the overrides itself after a failed read, cut off at half
// its deadline, so it too answers before the deadline).
func holdsOpening(t *testing.T, name string, answers []timed, failures int) {
	t.Helper()
	opened := len(answers)
	for i, a := range answers {
		if a.o.Kind == sluice.Unavailable && a.o.Cause == sluice.CircuitOpen {
			opened = i
			break
		}
	}
	if opened > failures {
		t.Errorf("%s: the breaker opened after %d answers, want at most %d (answers %v)", name, opened, failures, answers)
	}
	for i, a := range answers {
		waited := a.o.Kind == sluice.Indeterminate || a.o.Kind == sluice.Unavailable && a.o.Cause == sluice.FailedBeforeSend ||
			a.o.Kind == sluice.Unavailable && a.o.Cause == sluice.DeadlinePassed && strings.Contains(a.o.Err.Error(), "reading overrides")
		switch {
		case i < opened && !waited:
			t.Errorf("%s: check %d = %v (%v), want Indeterminate, failed before send, or a wait for the overrides cut off: the deadline cut it off (answers %v)", name, i, a, a.o.Err, answers)
		case i >= opened && (a.o.Kind != sluice.Unavailable || a.o.Cause != sluice.CircuitOpen):
			t.Errorf("%s: check %d = %v (%v), want circuit_open: the breaker opens after %d failures (answers %v)", name, i, a, a.o.Err, failures, answers)
		case i >= opened && !a.early:
			t.Errorf("%s: check %d shed once its %v deadline had passed, want at once (answers %v)", name, i, hangDeadline, answers)
		}
	}
}

// hangStore returns a limiter with the policy "hang" over a store over c
// with the default Timeout and breaker, and the breaker states it went
// through.
func hangStore(t *testing.T, c redis.UniversalClient, opts redisstore.Options) (*sluice.Limiter, *redisstore.Store, func() []string) {
	t.Helper()
	opts.Timeout = time.Second // the default: newStore's would be 10s
	return faultLimiter(t, c, opts, "hang")
}

// silentListener accepts connections, reads what they send and never
// answers, until the test ends.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

// TestHangOpensBreaker: Redis hangs (SIGSTOP of a redis-server the test
// started; a proxy that accepts connections and holds every byte; a
// listener that never answers, from the start) while checks arrive one
// after another, each with a 500ms deadline: the first 5 wait out their
// deadline and count, the breaker opens, and the next 10, then 10 at
// once, are shed at once. Ready answers without waiting on the hung
// Redis. Once Redis is back, checks are allowed again.
func TestHangOpensBreaker(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start returns the client's address and what breaks and heals
		// Redis; nil breakIt: hung from the start.
		start func(t *testing.T) (addr string, breakIt, heal func())
	}{
		{"SIGSTOP", func(t *testing.T) (string, func(), func()) {
			srv := redistest.Standalone(t)
			t.Cleanup(func() { srv.Resume() })
			return srv.Addr, func() {
					if err := srv.Pause(); err != nil {
						t.Fatal(err)
					}
				}, func() {
					if err := srv.Resume(); err != nil {
						t.Fatal(err)
					}
				}
		}},
		{"accepts, never answers", func(t *testing.T) (string, func(), func()) {
			srv := redistest.Standalone(t)
			p, err := faultproxy.New(srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			return p.Addr(), func() { p.Hang(); p.Drop() }, func() { p.Drop(); p.Forward() }
		}},
		{"listener that never answers, from the start", func(t *testing.T) (string, func(), func()) {
			return silentListener(t), nil, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			addr, breakIt, heal := tc.start(t)
			c := faultClient(addr)
			t.Cleanup(func() { c.Close() })
			l, s, states := hangStore(t, c, redisstore.Options{})
			subj := subject(t)
			if breakIt != nil {
				if a := checkTimed(l, "hang", subj); a.o.Kind != sluice.Allowed {
					t.Fatalf("warm-up = %v (%v)", a, a.o.Err)
				}
				breakIt()
			}
			var answers []timed
			for range hangFailures + hangShed {
				answers = append(answers, checkTimed(l, "hang", subj))
			}
			at := make([]timed, hangShed)
			var wg sync.WaitGroup
			for i := range at {
				wg.Go(func() { at[i] = checkTimed(l, "hang", subj) })
			}
			wg.Wait()
			answers = append(answers, at...)
			holdsOpening(t, tc.name, answers, hangFailures)
			start := time.Now()
			err := s.Ready(context.Background())
			t.Logf("%s: %d sequential checks, then %d at once: %v; Ready while hung: %v in %v; breaker states %v",
				tc.name, hangFailures+hangShed, hangShed, answers, err, time.Since(start).Round(100*time.Microsecond), states())
			if err == nil {
				t.Errorf("%s: Ready while Redis hangs = nil, want not ready", tc.name)
			}
			if got := states(); len(got) == 0 || got[0] != "open" {
				t.Errorf("%s: breaker states %v, want open first", tc.name, got)
			}
			if heal == nil {
				return
			}
			heal()
			var a timed
			for range 200 { // bounded: until the probe has half-opened the breaker
				if a = checkTimed(l, "hang", subj); a.o.Kind == sluice.Allowed {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if a.o.Kind != sluice.Allowed {
				t.Fatalf("%s: check once Redis is back = %v (%v), want allowed", tc.name, a, a.o.Err)
			}
			if err := s.Ready(context.Background()); err != nil {
				t.Errorf("%s: Ready once Redis is back = %v", tc.name, err)
			}
		})
	}
}

// TestHangClusterMaster: one master of a 3-master Redis Cluster is
// stopped (SIGSTOP): its subjects' checks wait out their deadline 5 times
// and are then shed at once by that master's breaker, while checks for
// subjects on the other two masters, asked in between, are all allowed.
// Ready names the hung master. After SIGCONT its subjects are allowed
// again.
func TestHangClusterMaster(t *testing.T) {
	checkLeaks(t)
	// A node timeout longer than the test: the other masters never mark
	// the stopped one failing, so the cluster stays up for their slots.
	cluster, err := redistest.StartCluster(3, 0, "cluster-node-timeout 60000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	c := cluster.Client()
	t.Cleanup(func() { c.Close() })
	l, s, states := hangStore(t, c, redisstore.Options{})
	subjects := subjectsPerMaster(t, c, 1)
	victim := cluster.Masters[0]
	if _, ok := subjects[victim.Addr]; !ok {
		t.Fatalf("no subject on master %s: %v", victim.Addr, subjects)
	}
	var addrs []string
	for addr := range subjects {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		if a := checkTimed(l, "hang", subjects[addr][0]); a.o.Kind != sluice.Allowed {
			t.Fatalf("warm-up on %s = %v (%v)", addr, a, a.o.Err)
		}
	}
	if err := victim.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Resume() })
	var hung []timed
	healthy := map[string][]timed{}
	for range hangFailures + hangShed {
		for _, addr := range addrs {
			a := checkTimed(l, "hang", subjects[addr][0])
			if addr == victim.Addr {
				hung = append(hung, a)
				continue
			}
			healthy[addr] = append(healthy[addr], a)
			if a.o.Kind != sluice.Allowed {
				t.Errorf("check on healthy master %s while %s hangs = %v (%v), want allowed", addr, victim.Addr, a, a.o.Err)
			}
		}
	}
	holdsOpening(t, "cluster master "+victim.Addr+" stopped", hung, hangFailures)
	start := time.Now()
	err = s.Ready(context.Background())
	t.Logf("hung master %s: %v; healthy masters: %v; Ready: %v in %v; states %v", victim.Addr, hung, healthy, err, time.Since(start).Round(100*time.Microsecond), states())
	if err == nil || !strings.Contains(err.Error(), victim.Addr) {
		t.Errorf("Ready while master %s hangs = %v, want not ready, naming it", victim.Addr, err)
	}
	if err := victim.Resume(); err != nil {
		t.Fatal(err)
	}
	var a timed
	for range 200 {
		if a = checkTimed(l, "hang", subjects[victim.Addr][0]); a.o.Kind == sluice.Allowed {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a.o.Kind != sluice.Allowed {
		t.Fatalf("check on %s once it is back = %v (%v), want allowed", victim.Addr, a, a.o.Err)
	}
	if got := states(); fmt.Sprint(got) != "[open half_open closed]" {
		t.Errorf("store's breaker states %v, want [open half_open closed]: one master's", got)
	}
}

// TestFCALLRevoked: the store's user loses +fcall at run time (ACL
// SETUSER -fcall): the decision FCALL was refused for (NOPERM, so it did
// not run) is sent again as EVALSHA and decided once; the store decides
// with scripts from then on, says why once (OnFallback), and the breaker
// never opens. Alone and with decisions queued behind one another.
func TestFCALLRevoked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		senders int
		at      int // decisions at once after the revoke
	}{
		{"alone", -1, 1},
		{"queued", 1, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			a := redistest.ACL(t, "sluice:")
			admin := a.AdminClient()
			defer admin.Close()
			user := a.UserClient()
			defer user.Close()
			var mu sync.Mutex
			var reasons, states []string
			s := newStore(t, user, redisstore.Options{Senders: tc.senders,
				OnFallback: func(r string) { mu.Lock(); reasons = append(reasons, r); mu.Unlock() },
				Breaker:    redisstore.BreakerOptions{OnChange: func(st string) { mu.Lock(); states = append(states, st); mu.Unlock() }}})
			const limit = 30
			p := policy(t, "revoked", sluice.FixedWindow, limit, time.Hour)
			subj := subject(t)
			if st := mustEvaluate(t, s, subj, 1, p); !st[0].Allowed || st[0].Remaining != limit-1 {
				t.Fatalf("before the revoke = %+v", st[0])
			}
			if err := admin.Do(ctx, "acl", "setuser", a.Username, "-fcall").Err(); err != nil {
				t.Fatal(err)
			}
			if err := user.Do(ctx, "fcall", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Fatalf("FCALL after ACL SETUSER -fcall = %v, want NOPERM", err)
			}
			errs := make([]error, tc.at)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() {
					st, err := evaluate(ctx, s, subj, 1, p)
					if err == nil && !st[0].Allowed {
						err = fmt.Errorf("denied: %+v", st[0])
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("decision %d after the revoke: %v, want allowed", i, err)
				}
			}
			for i := 1 + tc.at; i < limit; i++ {
				mustEvaluate(t, s, subj, 1, p)
			}
			if st := mustEvaluate(t, s, subj, 1, p); st[0].Allowed {
				t.Fatalf("decision %d of a limit of %d = %+v, want denied: each decision spent exactly once", limit+1, limit, st[0])
			}
			if err := s.Ready(ctx); err != nil {
				t.Errorf("Ready after the revoke: %v", err)
			}
			stats, err := admin.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			t.Logf("fallback: %q; breaker states %v", reasons, states)
			if len(reasons) != 1 || !strings.Contains(reasons[0], "NOPERM") || !strings.Contains(reasons[0], "fcall") {
				t.Errorf("OnFallback calls %q, want one naming NOPERM and fcall", reasons)
			}
			if len(states) != 0 {
				t.Errorf("breaker states %v, want none: a refused FCALL retried as EVALSHA is no failure", states)
			}
			if !strings.Contains(stats, "cmdstat_evalsha:") {
				t.Errorf("INFO commandstats shows no EVALSHA:\n%s", stats)
			}
		})
	}
}

// TestBreakerCountsCallerDeadlines: a caller deadline that cuts off round
// trips the store began counts, however short; callers who cancel, or
// whose context is done before the store asks Redis, do not. Redis is
// stopped for the test; the store's Timeout (10s) never ends a round
// trip here.
func TestBreakerCountsCallerDeadlines(t *testing.T) {
	checkLeaks(t)
	srv := redistest.Standalone(t)
	c := faultClient(srv.Addr)
	t.Cleanup(func() { c.Close() })
	var mu sync.Mutex
	var states []string
	s := newStore(t, c, redisstore.Options{Senders: -1, Breaker: redisstore.BreakerOptions{Failures: 3, ProbeEvery: -1, OpenFor: time.Hour,
		OnChange: func(st string) { mu.Lock(); states = append(states, st); mu.Unlock() }}})
	p := policy(t, "deadlines", sluice.FixedWindow, 100, time.Hour)
	subj := subject(t)
	mustEvaluate(t, s, subj, 1, p)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	isOpen := func() bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(states, "open") }
	// Cancelled callers, however many: no count. (go-redis notices a
	// cancellation only at the socket deadline a context deadline sets.)
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		time.AfterFunc(20*time.Millisecond, cancel)
		_, err := evaluate(ctx, s, subj, 1, p)
		if err == nil {
			t.Fatal("a decision against a stopped Redis succeeded")
		}
		t.Logf("cancelled: %v", err)
		cancel()
	}
	// Callers whose deadline has passed: nothing asked, no count.
	for range 5 {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		evaluate(ctx, s, subj, 1, p)
		cancel()
	}
	if isOpen() {
		t.Fatalf("breaker states %v after cancelled and expired callers, want still closed", states)
	}
	// Short deadlines that cut off round trips: each counts.
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, err := evaluate(ctx, s, subj, 1, p)
		cancel()
		if i < 2 && isOpen() {
			t.Fatalf("breaker open after %d cut-off round trips, want 3", i+1)
		}
		t.Logf("cut off %d: %v", i, err)
	}
	if !isOpen() {
		t.Fatalf("breaker states %v after 3 round trips cut off by their caller's deadline, want open", states)
	}
}

// TestFailoverShedsOnlyItsMaster: the fault test's load (6 workers, a
// decision every 5ms each, 1s deadlines, the store's Timeout 500ms) on
// two subjects of each master of a Cluster with a replica per master;
// one master is killed and its replica promoted. The dead master's
// breaker sheds its subjects; the other masters' subjects go on being
// decided, except while Redis itself refuses them: with
// cluster-require-full-coverage yes (Redis's default) every master
// answers CLUSTERDOWN from when the dead one is marked failing until its
// replica takes over, and those refusals open the healthy masters'
// breakers too; with it off they are all decided. With WaitReplicas 1 no
// write acknowledged to a decision is lost with the dead master: the
// budget spent equals the decisions allowed, exactly. It logs, per
// master, the outcomes from the kill to the promotion (RELIABILITY.md
// quotes them) and holds the fault tests' promises (answers within
// deadline + 250ms, nothing spent twice).
func TestFailoverShedsOnlyItsMaster(t *testing.T) {
	redistest.Long(t)
	for _, tc := range []struct {
		coverage string
		wait     int
	}{{"yes", 0}, {"no", 0}, {"no", 1}} {
		t.Run(fmt.Sprintf("full coverage %s, WaitReplicas %d", tc.coverage, tc.wait), func(t *testing.T) { failoverPerMaster(t, tc.coverage, tc.wait) })
	}
}

func failoverPerMaster(t *testing.T, coverage string, wait int) {
	checkLeaks(t)
	// With WAIT, a master needs a replica left once one is promoted.
	cluster, err := redistest.StartCluster(3, 1+wait, "cluster-node-timeout 1000", "cluster-require-full-coverage "+coverage)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	l := faultStore(t, c, redisstore.Options{WaitReplicas: wait})
	per := subjectsPerMaster(t, c, faultWorkers/3)
	dead := cluster.Masters[0]
	masterOf := map[string]string{}
	var addrs, subjects []string
	for addr := range per {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		for _, subj := range per[addr] {
			subjects = append(subjects, subj)
			masterOf[subj] = addr
		}
	}
	r := newRun(t, l, "fault", subjects)
	r.failover = wait == 0 // without WAIT, writes the dying master acknowledged may be lost
	r.load()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	replicas, err := cluster.ReplicasOf(ctx, dead.Addr)
	if err != nil {
		t.Fatal(err)
	}
	var killed, promoted time.Time
	var replica *redistest.Server
	r.inject(fault{breakIt: func() { dead.Kill(); killed = time.Now() }, heal: func() {
		if replica, err = cluster.WaitOnePromoted(ctx, replicas, dead.Addr); err != nil {
			t.Fatal(err)
		}
		promoted = time.Now()
	}})
	r.check("cluster master killed, replica promoted (per master)", "indeterminate/", "unavailable/failed_before_send", "unavailable/circuit_open", "unavailable/deadline_passed")
	r.mu.Lock()
	defer r.mu.Unlock()
	during := map[string]map[string]int{} // master → kind/cause → answers begun between the kill and the promotion
	for _, a := range r.answers {
		if a.start.Before(killed) || !a.start.Before(promoted) {
			continue
		}
		m := masterOf[r.subjects[a.worker]]
		if m == dead.Addr {
			m = "dead " + m
		}
		if during[m] == nil {
			during[m] = map[string]int{}
		}
		during[m][a.o.Kind.String()+"/"+a.o.Cause.String()]++
	}
	t.Logf("replica %s promoted %v after the kill; answers begun in between, per master: %v", replica.Addr, promoted.Sub(killed).Round(time.Millisecond), during)
	for m, kinds := range during {
		switch {
		case strings.HasPrefix(m, "dead "):
		case kinds["allowed/"] == 0:
			t.Errorf("no decision allowed on healthy master %s while %s failed over: %v", m, dead.Addr, kinds)
		case coverage == "no" && kinds["allowed/"] != sumKinds(kinds):
			t.Errorf("healthy master %s while %s failed over, its slots covered: %v, want every decision allowed", m, dead.Addr, kinds)
		}
	}
}

func sumKinds(kinds map[string]int) int {
	n := 0
	for _, k := range kinds {
		n += k
	}
	return n
}
