package redisstore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// Waiters across real processes on real Redis: TestWaitProcesses starts
// the test binary twice over as TestWaitChild, each one Limiter with
// wpWaiters goroutines that call Limiter.Wait on one subject of gcra
// 200/s, burst 10, until each was admitted wpRounds times, and judges the
// admissions by the slots the store booked them (the time Redis decided
// at plus the Delay it answered), never by when they woke:
//
//   - every interval [a, b] of slots holds at most burst + ⌊rate × (b −
//     a + 1µs)⌋ admissions (the 1µs: a slot is a whole µs, the schedule a
//     fraction of one);
//   - the admissions over the span of their slots, from the tenth on
//     (once both processes' waiters have started), are at least 95 % of
//     the rate;
//   - store calls (Evaluate) per admission are at most 1.5.
//
// With -sluice.bookpoll the children instead poll today's Check (a
// denial sleeps its Retry-After, then asks again), the loop Wait
// replaces: the figures are logged for BENCHMARKS.md, the bound still
// holds, and nothing else is asserted.

var bookPoll = flag.Bool("sluice.bookpoll", false, "TestWaitProcesses: poll Check instead of Wait, for the comparison in BENCHMARKS.md")

const (
	wpChildEnv = "SLUICE_WAIT_CHILD"
	wpMark     = "wpchild " // the prefix of a child's own lines on stdout
	wpChildren = 2
	wpWaiters  = 32 // per child
	wpRounds   = 12 // admissions per waiter
	wpLimit    = 200
	wpBurst    = 10
)

// wpParams is what a child is told, as JSON in wpChildEnv.
type wpParams struct {
	Addr    string
	Subject string
	Poll    bool
}

// wpSummary is a child's last line: its admissions' slots (Unix µs on
// Redis's clock), the Evaluate calls its store took, and failures.
type wpSummary struct {
	Slots    []int64
	Calls    int64
	Failures []string
}

func wpPolicy() sluice.Policy {
	return sluice.Policy{ID: "upstream", Algorithm: sluice.GCRA, Limit: wpLimit, Window: time.Second, Burst: wpBurst}
}

// wpSlotKey carries a waiter's *atomic.Int64 in a context: its store
// writes the time Redis decided its last decision at there.
type wpSlotKey struct{}

// wpStore gives each waiter a redisstore.Store of its own (one client
// for all), found by the context the Limiter hands down, so the time
// Redis answers a decision at (Driven.OnRedisTime, called on the deciding
// goroutine) is that waiter's; it counts the Evaluate calls of all.
type wpStore struct {
	c      redis.UniversalClient
	mu     sync.Mutex
	stores map[*atomic.Int64]*redisstore.Driven
	calls  atomic.Int64
}

func (s *wpStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	s.calls.Add(1)
	at, _ := ctx.Value(wpSlotKey{}).(*atomic.Int64)
	s.mu.Lock()
	st := s.stores[at]
	if st == nil {
		rs, err := redisstore.New(s.c, redisstore.Options{Timeout: 10 * time.Second})
		if err != nil {
			s.mu.Unlock()
			return err
		}
		st = &redisstore.Driven{Store: rs}
		if at != nil {
			st.OnRedisTime = func(now int64) { at.Store(now) }
		}
		s.stores[at] = st
	}
	s.mu.Unlock()
	return st.Evaluate(ctx, ev)
}

// TestWaitChild is the child half of TestWaitProcesses: it runs only
// when that test starts it with wpChildEnv set.
func TestWaitChild(t *testing.T) {
	spec := os.Getenv(wpChildEnv)
	if spec == "" {
		t.Skip("the child half of TestWaitProcesses: runs only when that test starts it")
	}
	if err := wpChild(spec, os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// wpChild connects, says "ready", waits for "go" on in, runs its waiters
// and prints its summary to out.
func wpChild(spec string, in io.Reader, out io.Writer) error {
	var p wpParams
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		return fmt.Errorf("%s: %w", wpChildEnv, err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true, PoolSize: 2 * wpWaiters})
	defer c.Close()
	store := &wpStore{c: c, stores: map[*atomic.Int64]*redisstore.Driven{}}
	l, err := sluice.New(store, []sluice.Policy{wpPolicy()}, sluice.Options{})
	if err != nil {
		return err
	}
	// Each waiter's store and connection made, and warm, before the go;
	// then the calls counted are the waiters'.
	ctxs := make([]context.Context, wpWaiters)
	for i := range ctxs {
		ctxs[i] = context.WithValue(context.Background(), wpSlotKey{}, new(atomic.Int64))
		if o := l.Check(ctxs[i], sluice.Request{Op: sluice.Peek, Policy: "upstream", Subject: p.Subject}); o.Kind != sluice.Allowed {
			return fmt.Errorf("warm-up peek: %v: %v", o.Kind, o.Err)
		}
	}
	store.calls.Store(0)
	fmt.Fprintln(out, wpMark+"ready")
	if sc := bufio.NewScanner(in); !sc.Scan() || sc.Text() != "go" {
		return fmt.Errorf("no go from the parent: %q %v", sc.Text(), sc.Err())
	}
	var (
		mu  sync.Mutex
		sum wpSummary
		wg  sync.WaitGroup
	)
	for _, ctx := range ctxs {
		wg.Go(func() {
			at := ctx.Value(wpSlotKey{}).(*atomic.Int64)
			var slots []int64
			var failures []string
			for len(slots) < wpRounds && len(failures) < 3 {
				o := wpAdmit(ctx, l, p)
				if o.Kind != sluice.Allowed {
					failures = append(failures, fmt.Sprintf("%v: %v", o.Kind, o.Err))
					continue
				}
				slots = append(slots, at.Load()+o.Delay.Microseconds())
			}
			mu.Lock()
			defer mu.Unlock()
			sum.Slots = append(sum.Slots, slots...)
			sum.Failures = append(sum.Failures, failures...)
		})
	}
	wg.Wait()
	sum.Calls = store.calls.Load()
	b, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s%s\n", wpMark, b)
	return err
}

// wpAdmit is one admission: a Wait, or with p.Poll today's loop, a Check
// that waits out the Retry-After of each denial (the workload compared,
// on the real clock as a caller's would be; ctx bounds it) and asks
// again.
func wpAdmit(ctx context.Context, l *sluice.Limiter, p wpParams) sluice.Outcome {
	req := sluice.Request{Policy: "upstream", Subject: p.Subject}
	if !p.Poll {
		return l.Wait(ctx, req)
	}
	for {
		o := l.Check(ctx, req)
		if o.Kind != sluice.Denied {
			return o
		}
		t := time.NewTimer(o.RetryAfter)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return sluice.Outcome{Kind: sluice.Unavailable, Cause: sluice.DeadlinePassed, Err: ctx.Err()}
		}
	}
}

func TestWaitProcesses(t *testing.T) {
	redistest.Long(t)
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	p := wpParams{Addr: srv.Addr, Subject: subject(t), Poll: *bookPoll}
	sums, fcalls := wpStart(t, c, p)
	var slots []int64
	var calls int64
	for i, s := range sums {
		if len(s.Failures) > 0 {
			t.Fatalf("child %d: outcomes that were no admission: %q", i, s.Failures)
		}
		slots = append(slots, s.Slots...)
		calls += s.Calls
	}
	slices.Sort(slots)
	n := int64(len(slots))
	if want := int64(wpChildren * wpWaiters * wpRounds); n != want {
		t.Fatalf("%d admissions, want %d", n, want)
	}
	for i := range slots {
		for j := i; j < len(slots); j++ {
			if in, most := int64(j-i+1), wpBurst+(slots[j]-slots[i]+1)*wpLimit/1_000_000; in > most {
				t.Fatalf("%d admissions with slots in [%d, %d] (%dµs), more than burst + rate × span = %d", in, slots[i], slots[j], slots[j]-slots[i], most)
			}
		}
	}
	if os.Getenv("SLUICE_WAIT_GAPS") != "" { // a diagnosis: where the slots leave gaps longer than 6ms
		for i := 1; i < len(slots); i++ {
			if g := slots[i] - slots[i-1]; g > 6000 {
				t.Logf("gap %dµs after admission %d", g, i)
			}
		}
	}
	span := float64(slots[n-1]-slots[0]) / 1e6
	// The steady rate: from the tenth admission on, once every waiter of
	// both processes has started (before, admissions come as fast as the
	// waiters start, not as the limiter spaces them).
	k := n / 10
	rate := float64(n-1-k) / (float64(slots[n-1]-slots[k]) / 1e6)
	perAdmission, scripts := float64(calls)/float64(n), float64(fcalls)/float64(n)
	t.Logf("poll=%v: %d admissions over %.3fs of slots (%.1f/s); from the tenth on %.1f/s (rate %d/s); %.3f store calls and %.3f script calls per admission", p.Poll, n, span, float64(n)/span, rate, wpLimit, perAdmission, scripts)
	if p.Poll {
		return // the comparison's figures, logged; the bound above holds for it too
	}
	if rate < 0.95*wpLimit {
		t.Errorf("%.1f admissions/s over the span of their slots from the tenth on, want at least 95%% of %d", rate, wpLimit)
	}
	if perAdmission > 1.5 {
		t.Errorf("%.3f store calls per admission, want at most 1.5", perAdmission)
	}
}

// wpStart runs wpChildren children with p and returns their summaries
// and the script calls Redis (c) counted from their go to their end,
// their warm-up left out. On failure it kills, by their handles, the
// children it started.
func wpStart(t *testing.T, c *redis.Client, p wpParams) ([]wpSummary, int64) {
	t.Helper()
	spec, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cs := startChildren(t, wpChildren, "^TestWaitChild$", wpMark, func(int) string { return wpChildEnv + "=" + string(spec) })
	timeout := time.After(2 * time.Minute)
	cs.waitReady(timeout)
	before := lqFcalls(t, c)
	cs.tell(func(int) string { return "go" })
	cs.waitDone(timeout)
	sums := make([]wpSummary, wpChildren)
	for i, ch := range cs.list {
		last := ch.lines[len(ch.lines)-1]
		if err := json.Unmarshal([]byte(last), &sums[i]); err != nil {
			cs.fail(i, fmt.Sprintf("said %q: %v", last, err))
		}
	}
	return sums, lqFcalls(t, c) - before
}
