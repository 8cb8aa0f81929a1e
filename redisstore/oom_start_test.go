package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestTooLittleMemoryForTheCode: a Redis with maxmemory 1mb (noeviction)
// from the start cannot take the code: FUNCTION LOAD is refused OOM (the
// 87 KB library in the query buffer passes the limit of a Redis that
// uses 0.9 MB empty; loaded, it costs about 300 KB). A decision fails
// before send naming OOM, nothing written, and Ready says so; once
// memory allows, the store loads the code and decides, with no restart
// (RELIABILITY.md).
func TestTooLittleMemoryForTheCode(t *testing.T) {
	srv, err := redistest.StartServer(t.TempDir(), "maxmemory 1mb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	closed := make(chan struct{}, 16)
	s := newStore(t, c, redisstore.Options{Breaker: redisstore.BreakerOptions{OnChange: func(state string) {
		if state == "closed" {
			closed <- struct{}{}
		}
	}}})
	p := policy(t, "oom", sluice.GCRA, 5, time.Minute)
	ctx := context.Background()
	_, err = evaluate(ctx, s, subject(t), 1, p)
	if !errors.Is(err, sluice.FailedBeforeSend) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a decision on a Redis too small for the code = %v, want failed before send naming OOM", err)
	}
	if err := s.Ready(ctx); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Ready = %v, want an error naming OOM", err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE = %d, %v; want nothing written", n, err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	subj := subject(t)
	for range 2 { // at most once more after the breaker, if it opened, closes
		st, err := evaluate(ctx, s, subj, 1, p)
		if err == nil && st[0].Allowed {
			return
		}
		if !errors.Is(err, sluice.CircuitOpen) {
			t.Fatalf("with memory to spare: %+v, %v; want allowed", st, err)
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the breaker did not close within 10s of memory to spare")
		}
	}
	t.Fatal("with memory to spare, no decision allowed")
}
