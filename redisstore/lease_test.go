package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// The helper-process half of TestLeasesAcrossProcesses: the environment
// names the Redis ("standalone:<addr>" or "cluster:<addr>,<addr>,…") and
// the subject; the helper says "ready", waits for "go" on stdin, acquires
// from leaseCallers goroutines at once, says "held <n>", and then holds
// its leases, never releasing them, until it is killed.
const (
	leaseHelperEnv  = "SLUICE_LEASE_HELPER_REDIS"
	leaseSubjectEnv = "SLUICE_LEASE_HELPER_SUBJECT"
	leaseLimit      = 7
	leaseCallers    = 100 // per process: 200 acquirers at once in all
	leaseTTL        = 10 * time.Second
)

// leaseLimiter is the limiter both processes use: "leaseLimit at once"
// over a store in caller-clock mode on a fake clock at clockStart,
// the same instant in both processes.
func leaseLimiter(c redis.UniversalClient) (*sluice.Limiter, *sluicetest.Clock, *redisstore.Store, error) {
	clock := sluicetest.NewClock()
	s, err := redisstore.New(c, redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour, Timeout: 20 * time.Second})
	if err != nil {
		return nil, nil, nil, err
	}
	l, err := sluice.New(s, []sluice.Policy{{ID: "leases", Algorithm: sluice.Concurrency, Limit: leaseLimit, LeaseTTL: leaseTTL}}, sluice.Options{})
	if err != nil {
		s.Close()
		return nil, nil, nil, err
	}
	return l, clock, s, nil
}

// acquireAll acquires the subject's lease from n goroutines released at
// once by start, and returns the leases held and any outcome that was
// neither allowed nor denied.
func acquireAll(l *sluice.Limiter, subj string, n int, start <-chan struct{}) (held []sluice.Lease, failures []sluice.Outcome) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			o := l.Check(context.Background(), sluice.Request{Op: sluice.Acquire, Policy: "leases", Subject: subj})
			mu.Lock()
			defer mu.Unlock()
			switch o.Kind {
			case sluice.Allowed:
				held = append(held, o.Lease)
			case sluice.Denied:
			default:
				failures = append(failures, o)
			}
		})
	}
	wg.Wait()
	return held, failures
}

func leaseHelper(spec string) int {
	var c redis.UniversalClient
	switch mode, addrs, _ := strings.Cut(spec, ":"); mode {
	case "cluster":
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ","), ContextTimeoutEnabled: true})
	default:
		c = redis.NewClient(&redis.Options{Addr: addrs, ContextTimeoutEnabled: true})
	}
	defer c.Close()
	l, _, s, err := leaseLimiter(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer s.Close()
	// Warm the connections (and the cluster's slot map) first, so both
	// processes race from the same start.
	for range 4 {
		l.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "leases", Subject: os.Getenv(leaseSubjectEnv)})
	}
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() || in.Text() != "go" {
		return 2
	}
	start := make(chan struct{})
	close(start)
	held, failures := acquireAll(l, os.Getenv(leaseSubjectEnv), leaseCallers, start)
	for _, o := range failures {
		fmt.Fprintf(os.Stderr, "acquire: %v: %v\n", o.Kind, o.Err)
	}
	if len(failures) > 0 {
		return 3
	}
	fmt.Printf("held %d\n", len(held))
	io.Copy(io.Discard, os.Stdin) // hold the leases "mid-request" until killed
	return 0
}

// TestLeasesAcrossProcesses: two OS processes on one Redis (standalone,
// then the 3-master cluster), 100 acquirers each at once, hold exactly the
// limit of leases between them. The helper is then killed while holding
// its leases: they stay held until lease_ttl has passed since they were
// taken, and not a microsecond longer.
func TestLeasesAcrossProcesses(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		c := standaloneClient(t)
		testLeasesAcrossProcesses(t, c, "standalone:"+shared.standalone.Addr)
	})
	t.Run("cluster", func(t *testing.T) {
		c := clusterClient(t)
		testLeasesAcrossProcesses(t, c, "cluster:"+strings.Join(shared.cluster.Addrs, ","))
	})
}

func testLeasesAcrossProcesses(t *testing.T, c redis.UniversalClient, spec string) {
	subj := subject(t)
	l, clock, s, err := leaseLimiter(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	peek := func() int64 {
		t.Helper()
		o := l.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "leases", Subject: subj})
		if o.Kind != sluice.Allowed && o.Kind != sluice.Denied {
			t.Fatalf("peek = %v: %v", o.Kind, o.Err)
		}
		return o.Remaining
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaseHelperEnv+"="+spec, leaseSubjectEnv+"="+subj)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var killed atomic.Bool
	kill := func() {
		if killed.CompareAndSwap(false, true) {
			cmd.Process.Kill() // the helper this test started, by its own handle
			cmd.Wait()
		}
	}
	t.Cleanup(kill)
	out := bufio.NewScanner(stdout)
	if !out.Scan() || out.Text() != "ready" {
		kill()
		t.Fatalf("helper did not get ready: %q, stderr %s", out.Text(), stderr.String())
	}

	for range 4 { // warm the connections, as the helper did
		peek()
	}
	start := make(chan struct{})
	type result struct {
		held     []sluice.Lease
		failures []sluice.Outcome
	}
	mine := make(chan result, 1)
	go func() {
		h, f := acquireAll(l, subj, leaseCallers, start)
		mine <- result{h, f}
	}()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	close(start)
	var theirs int
	if !out.Scan() {
		kill()
		t.Fatalf("helper said nothing: stderr %s", stderr.String())
	}
	if _, err := fmt.Sscanf(out.Text(), "held %d", &theirs); err != nil {
		t.Fatalf("helper said %q: %v", out.Text(), err)
	}
	r := <-mine
	for _, o := range r.failures {
		t.Errorf("acquire: %v: %v", o.Kind, o.Err)
	}
	if got := len(r.held) + theirs; got != leaseLimit {
		t.Fatalf("200 acquirers in two processes hold %d leases (%d here, %d in the helper), want exactly %d", got, len(r.held), theirs, leaseLimit)
	}
	if got := peek(); got != 0 {
		t.Fatalf("remaining with every lease held = %d, want 0", got)
	}
	t.Logf("%d acquirers in two processes: %d leases held here, %d in the helper", 2*leaseCallers, len(r.held), theirs)
	for _, lease := range r.held {
		if o := l.Check(context.Background(), sluice.Request{Op: sluice.Release, Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID}); o.Kind != sluice.Allowed {
			t.Fatalf("Release = %v: %v", o.Kind, o.Err)
		}
	}
	if got := peek(); got != int64(len(r.held)) {
		t.Fatalf("remaining after releasing this process's %d leases = %d, want %d", len(r.held), got, len(r.held))
	}

	kill() // mid-request: the helper's leases are never released
	clock.Advance(leaseTTL - time.Microsecond)
	if got := peek(); got != int64(len(r.held)) {
		t.Fatalf("remaining 1µs before the killed holder's leases expire = %d, want %d", got, len(r.held))
	}
	clock.Advance(time.Microsecond)
	if got := peek(); got != leaseLimit {
		t.Fatalf("remaining once the killed holder's leases expired = %d, want %d: a slot leaked", got, leaseLimit)
	}
}

// TestLeaseKeys: a concurrency policy's state is one sorted set under the
// subject's hash tag, policy id, revision and "c"; its members are the
// lease ids, scored by expiry; its TTL is the latest expiry plus the
// grace; expired leases are swept by the next write; a release of the
// last lease deletes it.
func TestLeaseKeys(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s, clock := callerStore(t, c) // ExtraTTL 1h: the grace
	l, err := sluice.New(s, []sluice.Policy{{ID: "keys", Revision: 3, Algorithm: sluice.Concurrency, Limit: 3, LeaseTTL: 10 * time.Second}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	subj := subject(t)
	acquire := func() sluice.Lease {
		t.Helper()
		o := l.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "keys", Subject: subj})
		if o.Kind != sluice.Allowed {
			t.Fatalf("acquire = %v: %v", o.Kind, o.Err)
		}
		return o.Lease
	}
	a := acquire()
	clock.Advance(4 * time.Second)
	b := acquire()
	p, _ := l.Policy("keys")
	key := s.Key(subj, &p)
	if !strings.HasSuffix(key, "{"+subj+"}keys:3:c") {
		t.Fatalf("key %q, want it to end in {subject}keys:3:c", key)
	}
	if typ := c.Type(ctx, key).Val(); typ != "zset" {
		t.Fatalf("TYPE %s = %q, want zset", key, typ)
	}
	start := clockStart.UnixMicro()
	got := c.ZRangeWithScores(ctx, key, 0, -1).Val()
	want := []redis.Z{{Score: float64(start + 10_000_000), Member: a.ID}, {Score: float64(start + 14_000_000), Member: b.ID}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ZRANGE %s = %v, want %v", key, got, want)
	}
	// now is Start+4s; the latest lease expires at Start+14s: 10s, plus 1h.
	if ttl := c.PTTL(ctx, key).Val(); ttl <= time.Hour+9*time.Second || ttl > time.Hour+10*time.Second {
		t.Fatalf("PTTL %s = %v, want just under 1h10s (latest expiry 10s away, plus the 1h grace)", key, ttl)
	}
	clock.Advance(7 * time.Second) // a expired at Start+10s, without a release
	acquire()
	if n := c.ZCard(ctx, key).Val(); n != 2 {
		t.Fatalf("ZCARD after a's expiry and one more lease = %d, want 2: expired leases are swept", n)
	}
	if o := l.Check(ctx, sluice.Request{Op: sluice.Release, Policies: b.Policies, Subject: b.Subject, LeaseID: b.ID}); o.Kind != sluice.Allowed {
		t.Fatalf("Release = %v: %v", o.Kind, o.Err)
	}
	clock.Advance(time.Hour)
	if o := l.Check(ctx, sluice.Request{Op: sluice.Release, Policies: a.Policies, Subject: a.Subject, LeaseID: a.ID}); o.Kind != sluice.Allowed || o.Remaining != 3 {
		t.Fatalf("Release of an expired lease = %+v (%v), want allowed, 3 remaining", o, o.Err)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("EXISTS %s after every lease went = %d, want 0", key, n)
	}
}

// TestLeaseCorruptState: a concurrency key holding what the script never
// writes is Unavailable (corrupt_state), never reset silently; a reset
// clears it.
func TestLeaseCorruptState(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	l, err := sluice.New(s, []sluice.Policy{{ID: "conc", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		harm func(key string) error
		want string
	}{
		{"a string", func(k string) error { return c.Set(ctx, k, "x", time.Hour).Err() }, "holds another type"},
		{"a fractional expiry", func(k string) error { return c.ZAdd(ctx, k, redis.Z{Score: 1.5, Member: "l"}).Err() }, "want an integer > 0"},
		{"an expiry in 11 days", func(k string) error {
			return c.ZAdd(ctx, k, redis.Z{Score: float64(time.Now().Add(11 * 24 * time.Hour).UnixMicro()), Member: "l"}).Err()
		}, "after the time of this call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			subj := subject(t)
			p, _ := l.Policy("conc")
			if err := tc.harm(s.Key(subj, &p)); err != nil {
				t.Fatal(err)
			}
			c.Expire(ctx, s.Key(subj, &p), time.Hour)
			o := l.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "conc", Subject: subj})
			if o.Kind != sluice.Unavailable || o.Cause != sluice.CorruptState || !strings.Contains(o.Err.Error(), tc.want) {
				t.Fatalf("Check over %s = %+v, want Unavailable, corrupt_state, saying %q", tc.name, o, tc.want)
			}
			if o := l.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: "conc", Subject: subj}); o.Kind != sluice.Allowed {
				t.Fatalf("Reset = %+v", o)
			}
			if o := l.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "conc", Subject: subj}); o.Kind != sluice.Allowed {
				t.Fatalf("Check after the reset = %+v", o)
			}
		})
	}
}
