package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// recoveryBound is how long a test waits for sluice to decide again after
// the Sentinels' master is killed: the failover itself takes a few
// seconds (redistest's down-after 1s, failover-timeout 5s); the rest is
// room for a busy machine.
const recoveryBound = 60 * time.Second

// TestSentinelFailover: a store over a go-redis failover client decides
// through the master three Sentinels monitor; when that master is killed
// and they promote its replica, the store decides again, on the new
// master, within recoveryBound, and nothing is spent twice: the decisions
// taken before the failover (replicated: WAIT) and the one retried with
// its evaluation id across it are each answered once, their repeats
// Replayed with the first answer.
func TestSentinelFailover(t *testing.T) {
	set := redistest.SentinelSet(t, "sluice-failover")
	c := set.Client()
	defer c.Close()
	s := newStore(t, c, redisstore.Options{Timeout: time.Second})
	l, err := sluice.New(s, []sluice.Policy{{ID: "api", Algorithm: sluice.SlidingLog, Limit: 10, Window: time.Hour, DedupeTTL: 10 * time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	subj := subject(t)
	ctx := context.Background()
	check := func(id string) sluice.Outcome {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return l.Check(ctx, sluice.Request{Policy: "api", Subject: subj, EvaluationID: id})
	}
	for i := range 4 {
		id := fmt.Sprintf("before-%d", i)
		if o := check(id); o.Kind != sluice.Allowed || o.Remaining != int64(9-i) {
			t.Fatalf("Check(%q) before the failover = %+v, want allowed, remaining %d", id, o, 9-i)
		}
	}
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v: the replica must hold the decisions before the master dies", n, err)
	}

	set.Master.Kill()
	killed := time.Now()
	o, attempts := decideAgain(t, func() sluice.Outcome { return check("during") })
	t.Logf("decided again %v after the master was killed, after %d attempts: %+v", time.Since(killed).Round(time.Millisecond), attempts, o)
	if o.Kind != sluice.Allowed || o.Remaining != 5 {
		t.Fatalf("Check(%q) after the failover = %+v, want allowed, remaining 5: the 4 replicated spends and its own", "during", o)
	}
	if err := set.WaitFailover(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		id := fmt.Sprintf("before-%d", i)
		if o := check(id); o.Kind != sluice.Allowed || !o.Replayed || o.Remaining != int64(9-i) {
			t.Fatalf("retry of %q after the failover = %+v, want its first answer replayed (remaining %d)", id, o, 9-i)
		}
	}
	if o := check("during"); o.Kind != sluice.Allowed || !o.Replayed || o.Remaining != 5 {
		t.Fatalf("retry of %q = %+v, want its answer replayed (remaining 5)", "during", o)
	}
	if o := l.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: "api", Subject: subj}); o.Kind != sluice.Allowed || o.Remaining != 5 {
		t.Fatalf("Peek after the retries = %+v, want remaining 5: nothing spent twice", o)
	}
	if o := check("after"); o.Kind != sluice.Allowed || o.Replayed || o.Remaining != 4 {
		t.Fatalf("Check(%q) = %+v, want a new spend, remaining 4", "after", o)
	}
}

// decideAgain calls check every 100ms until it answers a decision
// (Allowed or Denied), for at most recoveryBound, and returns it with the
// number of calls; it fails the test if no decision comes.
func decideAgain(t *testing.T, check func() sluice.Outcome) (sluice.Outcome, int) {
	t.Helper()
	deadline := time.Now().Add(recoveryBound)
	var o sluice.Outcome
	seen := map[string]int{} // what the attempts before the decision answered
	for n := 1; ; n++ {
		o = check()
		if o.Kind == sluice.Allowed || o.Kind == sluice.Denied {
			t.Logf("answers before the decision: %v", seen)
			return o, n
		}
		seen[strings.TrimSuffix(o.Kind.String()+" "+o.Cause.String(), " ")]++
		if time.Now().After(deadline) {
			t.Fatalf("no decision within %v of the master's death (%d attempts: %v); the last: %+v", recoveryBound, n, seen, o)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
