package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestSentinelSettleAcrossFailover: an estimate spent through a failover
// client and replicated (WAIT) is settled after its master died, on the
// replica the Sentinels promoted: the record of the estimate went over
// with the state, so the settle gives the difference back once, and its
// retry answers the same.
func TestSentinelSettleAcrossFailover(t *testing.T) {
	set := redistest.SentinelSet(t, "sluice-settle")
	c := set.Client()
	defer c.Close()
	s := newStore(t, c, redisstore.Options{Timeout: time.Second})
	l, err := sluice.New(s, []sluice.Policy{{ID: "tokens", Algorithm: sluice.TokenBucket, Limit: 100, Window: time.Hour, DedupeTTL: 10 * time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := sluice.Request{Op: sluice.Estimate, Policy: "tokens", Subject: subject(t), Cost: 40, EvaluationID: "call-1"}
	if o := l.Check(ctx, req); o.Kind != sluice.Allowed || o.Remaining != 60 {
		t.Fatalf("estimate of 40 = %+v, want allowed, 60 remaining", o)
	}
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v: the replica must hold the estimate before the master dies", n, err)
	}
	set.Master.Kill()
	req.Op, req.Cost = sluice.Settle, 10
	settle := func() sluice.Outcome {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return l.Check(ctx, req)
	}
	o, _ := decideAgain(t, settle)
	if o.Kind != sluice.Allowed || o.GivenBack != 30 || o.Remaining < 90 {
		t.Fatalf("settle at 10 after the failover = %+v, want allowed, 30 given back, 90 remaining (or more, refilled)", o)
	}
	if err := set.WaitFailover(ctx); err != nil {
		t.Fatal(err)
	}
	if again := settle(); !again.Replayed || again.GivenBack != 30 {
		t.Fatalf("retried settle = %+v, want the first answer replayed", again)
	}
}
