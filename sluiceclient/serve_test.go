package sluiceclient_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/openapitest"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
	"github.com/sluicehq/sluice/sluiceclient"
)

// The policies "short" (lease_ttl 1s) and "half" (500ms) in serveConfig
// time renewCase: short, so that a renewal is seen to outlive a TTL, and
// long enough that a request on a busy machine mostly lands inside one.
// The server's own clock measures them: a real TTL must pass.

// serveConfig is the configuration of the sluice serve process, on a
// free loopback port. The rate policies are an hour and a day
// long so that no verdict depends on how fast the machine is.
const serveConfig = `
server:
  listen: "127.0.0.1:0"
policies:
  - { id: quota, algorithm: fixed_window, limit: 3, window: 1h }
  - { id: daily, algorithm: sliding_log, limit: 10, window: 24h }
  - { id: slots, algorithm: concurrency, limit: 1, lease_ttl: 1h }
  - { id: short, algorithm: concurrency, limit: 1, lease_ttl: 1s }
  - { id: half, algorithm: concurrency, limit: 1, lease_ttl: 500ms }
  - { id: shared, algorithm: gcra, limit: 4, window: 1h, priorities: { critical: 100%, sheddable: 50% } }
`

// TestMain removes the binary servetest built.
func TestMain(m *testing.M) {
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// startSluice runs `sluice serve` on serveConfig as a process of its own
// (servetest: built once, ready on its start line) and stops it when t
// ends, expecting a clean shutdown. It returns the server's URL.
func startSluice(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(serveConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := servetest.Start(servetest.Binary(t), servetest.Options{}, "serve", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("sluice serve (pid %d): %v after SIGTERM, want a clean shutdown\n%s", p.PID(), err, p.Logs())
		}
	})
	return p.URL
}

// TestEveryOperationAgainstSluiceServe sends every operation of a
// sluice.Request through the client to a real sluice serve process and
// reads its effect back from the store through the API (a peek). Each
// case has a subject of its own.
func TestEveryOperationAgainstSluiceServe(t *testing.T) {
	// Every exchange is validated against the HTTP API's OpenAPI
	// document: the Go client's requests and the real server's answers.
	c := newClient(t, startSluice(t), sluiceclient.Options{HTTPClient: openapitest.Client(t)})
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *sluiceclient.Client, subj string)
	}{
		{"spend", spendCase},
		{"peek", peekCase},
		{"refund", refundCase},
		{"reset", resetCase},
		{"several policies", severalCase},
		{"evaluation id replayed", replayCase},
		{"acquire", acquireCase},
		{"release", releaseCase},
		{"renew", renewCase},
		{"estimate and settle", settleCase},
		{"priorities", priorityCase},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c, "subject-"+tc.name) })
	}
}

// check asks c for req and fails t unless the outcome is of kind want.
func check(t *testing.T, c *sluiceclient.Client, req sluice.Request, want sluice.Kind) sluice.Outcome {
	t.Helper()
	o := c.Check(t.Context(), req)
	if o.Kind != want {
		t.Fatalf("Check(%+v) = %v (%+v, err %v), want %v", req, o.Kind, o, o.Err, want)
	}
	return o
}

// remaining peeks at policy for subj through the API.
func remaining(t *testing.T, c *sluiceclient.Client, policy, subj string) int64 {
	t.Helper()
	o := c.Check(t.Context(), sluice.Request{Op: sluice.Peek, Policy: policy, Subject: subj})
	if o.Kind != sluice.Allowed && o.Kind != sluice.Denied {
		t.Fatalf("peek at %s for %s = %v: %v", policy, subj, o.Kind, o.Err)
	}
	return o.Remaining
}

// wantRemaining fails t unless every policy of want has that many
// remaining for subj.
func wantRemaining(t *testing.T, c *sluiceclient.Client, subj, after string, want map[string]int64) {
	t.Helper()
	for policy, n := range want {
		if got := remaining(t, c, policy, subj); got != n {
			t.Errorf("after %s: %s has %d remaining, want %d", after, policy, got, n)
		}
	}
}

// priorityCase: on gcra 4 per hour whose sheddable class may use 50 %,
// two sheddable spends pass and the third is shed, answering 0
// remaining and the wait for a unit above the reserve (15m at 4/h);
// critical spends then take the other two; a class the server's policies
// do not declare is Incompatible.
func priorityCase(t *testing.T, c *sluiceclient.Client, subj string) {
	shed := sluice.Request{Policy: "shared", Subject: subj, Priority: "sheddable"}
	check(t, c, shed, sluice.Allowed)
	if o := check(t, c, shed, sluice.Allowed); o.Remaining != 0 {
		t.Errorf("second sheddable spend = %+v, want 0 remaining for the class", o.Status)
	}
	if o := check(t, c, shed, sluice.Denied); o.Remaining != 0 || o.RetryAfter < 15*time.Minute-time.Second || o.RetryAfter > 15*time.Minute {
		t.Errorf("third sheddable spend = %+v, want shed: 0 remaining, retry after about 15m", o.Status)
	}
	crit := sluice.Request{Policy: "shared", Subject: subj, Priority: "critical"}
	check(t, c, crit, sluice.Allowed)
	if o := check(t, c, crit, sluice.Allowed); o.Remaining != 0 {
		t.Errorf("second critical spend = %+v, want the whole limit used", o.Status)
	}
	check(t, c, crit, sluice.Denied)
	check(t, c, sluice.Request{Policy: "shared", Subject: subj, Priority: "bulk"}, sluice.Incompatible)
}

func settleCase(t *testing.T, c *sluiceclient.Client, subj string) {
	req := sluice.Request{Op: sluice.Estimate, Policy: "quota", Subject: subj, Cost: 3, EvaluationID: "call-1"}
	if o := check(t, c, req, sluice.Allowed); o.Remaining != 0 {
		t.Errorf("estimate of 3 = %+v, want nothing remaining", o.Status)
	}
	req.Op, req.Cost = sluice.Settle, 1
	o := check(t, c, req, sluice.Allowed)
	if o.GivenBack != 2 || o.Charged != 0 || o.Remaining != 2 || o.Replayed {
		t.Errorf("settle at 1 = %+v, want 2 given back, 2 remaining", o.Status)
	}
	req.Cost = 0
	if again := check(t, c, req, sluice.Allowed); !again.Replayed || again.Status != o.Status {
		t.Errorf("retried settle = %+v (replayed %v), want %+v replayed", again.Status, again.Replayed, o.Status)
	}
	wantRemaining(t, c, subj, "an estimate of 3 settled at 1", map[string]int64{"quota": 2})
}

func spendCase(t *testing.T, c *sluiceclient.Client, subj string) {
	o := check(t, c, sluice.Request{Policy: "quota", Subject: subj, Cost: 2}, sluice.Allowed)
	if o.Policy != "quota" || o.Limit != 3 || o.Remaining != 1 || o.ResetAfter <= 0 {
		t.Errorf("spend of 2 = %+v, want quota with 1 of 3 remaining", o.Status)
	}
	wantRemaining(t, c, subj, "a spend of 2", map[string]int64{"quota": 1})
	check(t, c, sluice.Request{Policy: "quota", Subject: subj, Cost: 2}, sluice.Denied)
	wantRemaining(t, c, subj, "a denied spend", map[string]int64{"quota": 1})
}

func peekCase(t *testing.T, c *sluiceclient.Client, subj string) {
	check(t, c, sluice.Request{Policies: []string{"quota", "daily"}, Subject: subj}, sluice.Allowed)
	for i := range 3 {
		if o := check(t, c, sluice.Request{Op: sluice.Peek, Policies: []string{"quota", "daily"}, Subject: subj}, sluice.Allowed); o.Statuses[0].Remaining != 2 || o.Statuses[1].Remaining != 9 {
			t.Fatalf("peek #%d = %+v, want 2 and 9 remaining", i+1, o.Statuses)
		}
	}
	wantRemaining(t, c, subj, "three peeks", map[string]int64{"quota": 2, "daily": 9})
}

func refundCase(t *testing.T, c *sluiceclient.Client, subj string) {
	check(t, c, sluice.Request{Policy: "quota", Subject: subj, Cost: 3}, sluice.Allowed)
	check(t, c, sluice.Request{Policy: "quota", Subject: subj}, sluice.Denied)
	if o := check(t, c, sluice.Request{Op: sluice.Refund, Policy: "quota", Subject: subj, Cost: 2}, sluice.Allowed); o.Remaining != 2 {
		t.Errorf("refund of 2 = %+v, want 2 remaining", o.Status)
	}
	wantRemaining(t, c, subj, "a refund of 2", map[string]int64{"quota": 2})
	check(t, c, sluice.Request{Op: sluice.Refund, Policy: "quota", Subject: subj}, sluice.Allowed) // Cost 0: 1
	wantRemaining(t, c, subj, "a refund of the default cost", map[string]int64{"quota": 3})
}

// resetCase fails on the client of commit 1413fe3, which sent a reset as
// a spend of 1: denied here, with quota spent.
func resetCase(t *testing.T, c *sluiceclient.Client, subj string) {
	both := []string{"quota", "daily"}
	check(t, c, sluice.Request{Policies: both, Subject: subj, Cost: 3}, sluice.Allowed)
	check(t, c, sluice.Request{Policies: both, Subject: subj}, sluice.Denied)
	o := check(t, c, sluice.Request{Op: sluice.Reset, Policies: both, Subject: subj}, sluice.Allowed)
	if len(o.Statuses) != 2 || o.Statuses[0].Remaining != 3 || o.Statuses[1].Remaining != 10 {
		t.Errorf("reset = %+v, want the statuses of fresh state (3 and 10 remaining)", o.Statuses)
	}
	wantRemaining(t, c, subj, "a reset", map[string]int64{"quota": 3, "daily": 10})
}

func severalCase(t *testing.T, c *sluiceclient.Client, subj string) {
	o := check(t, c, sluice.Request{Policies: []string{"daily", "quota"}, Subject: subj, Cost: 2}, sluice.Allowed)
	if o.Policy != "quota" || o.Remaining != 1 || len(o.Statuses) != 2 || o.Statuses[0].Policy != "daily" || o.Statuses[0].Remaining != 8 {
		t.Errorf("spend of 2 on daily and quota = %+v, want quota most restrictive (1), daily 8", o)
	}
	o = check(t, c, sluice.Request{Policies: []string{"daily", "quota"}, Subject: subj, Cost: 2}, sluice.Denied)
	if o.Policy != "quota" || !o.Statuses[0].Allowed || o.Statuses[1].Allowed {
		t.Errorf("second spend of 2 = %+v, want denied by quota, daily admitting", o)
	}
	wantRemaining(t, c, subj, "a denied spend on both (all or nothing)", map[string]int64{"quota": 1, "daily": 8})
}

func replayCase(t *testing.T, c *sluiceclient.Client, subj string) {
	req := sluice.Request{Policy: "quota", Subject: subj, EvaluationID: "order-42"}
	if o := check(t, c, req, sluice.Allowed); o.Replayed || o.Remaining != 2 {
		t.Fatalf("first check with evaluation id order-42 = %+v, want a fresh decision, 2 remaining", o)
	}
	for i := range 2 {
		if o := check(t, c, req, sluice.Allowed); !o.Replayed || o.Remaining != 2 {
			t.Errorf("repeat #%d = %+v, want the first decision replayed", i+1, o)
		}
	}
	wantRemaining(t, c, subj, "three checks with one evaluation id", map[string]int64{"quota": 2})
}

func acquireCase(t *testing.T, c *sluiceclient.Client, subj string) {
	o := check(t, c, sluice.Request{Op: sluice.Acquire, Policy: "slots", Subject: subj}, sluice.Allowed)
	if o.Lease.ID == "" || o.Lease.Subject != subj || fmt.Sprint(o.Lease.Policies) != "[slots]" {
		t.Fatalf("acquire = %+v, want a lease on [slots] for %s", o.Lease, subj)
	}
	wantRemaining(t, c, subj, "an acquire", map[string]int64{"slots": 0})
	// A plain check of a concurrency policy acquires too: the slot is taken.
	if o := check(t, c, sluice.Request{Policy: "slots", Subject: subj}, sluice.Denied); o.Lease.ID != "" {
		t.Errorf("check with the slot held = %+v, want denied without a lease", o)
	}
}

func releaseCase(t *testing.T, c *sluiceclient.Client, subj string) {
	o := check(t, c, sluice.Request{Op: sluice.Acquire, Policy: "slots", Subject: subj}, sluice.Allowed)
	for i := range 2 { // idempotent
		check(t, c, sluice.Request{Op: sluice.Release, Policy: "slots", Subject: subj, LeaseID: o.Lease.ID}, sluice.Allowed)
		wantRemaining(t, c, subj, fmt.Sprintf("release #%d", i+1), map[string]int64{"slots": 1})
	}
	// A lease taken with a rate policy, given back by the shorthand.
	o = check(t, c, sluice.Request{Op: sluice.Acquire, Policies: []string{"quota", "slots"}, Subject: subj}, sluice.Allowed)
	wantRemaining(t, c, subj, "an acquire with quota", map[string]int64{"slots": 0, "quota": 2})
	if r := c.Release(t.Context(), o.Lease); r.Kind != sluice.Allowed || len(r.Statuses) != 1 || r.Statuses[0].Policy != "slots" {
		t.Fatalf("Release(%+v) = %+v (%v), want allowed with the status of slots only", o.Lease, r, r.Err)
	}
	wantRemaining(t, c, subj, "Release", map[string]int64{"slots": 1, "quota": 2})
}

// renewCase: a lease renewed halfway through its TTL is still held after
// that first TTL has passed, while one acquired beside it and never
// renewed has expired. The server's clock says when: each wait is for a
// lease of its own to expire (polled, bounded), never a sleep, and a
// witness lease taken just before the renewal tells whether the answer
// about the renewed one came in time (else the attempt is tried again,
// three times at most).
func renewCase(t *testing.T, c *sluiceclient.Client, subj string) {
	for attempt := 1; ; attempt++ {
		name := func(role string) string { return fmt.Sprintf("%s-%d-%s", subj, attempt, role) }
		o := check(t, c, sluice.Request{Op: sluice.Acquire, Policy: "short", Subject: name("kept")}, sluice.Allowed)
		check(t, c, sluice.Request{Op: sluice.Acquire, Policy: "short", Subject: name("left")}, sluice.Allowed)
		check(t, c, sluice.Request{Op: sluice.Acquire, Policy: "half", Subject: name("half")}, sluice.Allowed)
		expired(t, c, "half", name("half")) // halfway through kept's TTL
		check(t, c, sluice.Request{Op: sluice.Acquire, Policy: "short", Subject: name("witness")}, sluice.Allowed)
		r := check(t, c, sluice.Request{Op: sluice.Renew, Policy: "short", Subject: name("kept"), LeaseID: o.Lease.ID}, sluice.Allowed)
		if r.Lease.ID != o.Lease.ID {
			t.Fatalf("renew = lease %+v, want %+v", r.Lease, o.Lease)
		}
		// left, taken after kept, has expired: kept's first TTL has passed.
		expired(t, c, "short", name("left"))
		heldKept := remaining(t, c, "short", name("kept"))
		// The witness, taken before the renewal, still held after that
		// answer: the renewed lease was too when it was read.
		if remaining(t, c, "short", name("witness")) == 0 {
			if heldKept != 0 {
				t.Errorf("a lease renewed halfway, after its first TTL: %d slots free, want 0 (still held)", heldKept)
			}
			return
		}
		if attempt == 3 {
			t.Fatalf("three attempts answered too slowly to tell whether a renewal outlives the first TTL (1s)")
		}
	}
}

// expired polls, a bounded number of times, until subj's lease on a
// concurrency policy of limit 1 has expired: its slot is free again.
func expired(t *testing.T, c *sluiceclient.Client, policy, subj string) {
	t.Helper()
	for range 1000 { // 20s at most: a bound on a loaded machine
		if remaining(t, c, policy, subj) == 1 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the lease of %s on %s never expired", subj, policy)
}
