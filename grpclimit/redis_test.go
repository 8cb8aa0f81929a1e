package grpclimit_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestRedisDown: over a real redis-server that is then killed, a method
// whose policy fails closed is answered Unavailable, with a RetryInfo,
// and one whose policy fails open goes on; both were limited while Redis
// answered.
func TestRedisDown(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	store, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ints := newOn(t, store, grpclimit.Options{
		Methods: []grpclimit.Method{
			{Name: echoUnary, Policies: []string{"closed"}},
			{Name: otherUnary, Policies: []string{"open"}, FailureMode: failure.Open},
		},
		Deadline: 2 * time.Second, // generous: a loaded machine never fails the calls Redis answers
	}, slidingLog("closed", 1, time.Minute), slidingLog("open", 1, time.Minute))
	s := serveInterceptors(t, ints)
	for _, m := range []string{echoUnary, otherUnary} {
		_, err := s.call(t, m)
		wantCode(t, m+" with Redis up", err, codes.OK)
		_, err = s.call(t, m)
		wantCode(t, m+" again with Redis up", err, codes.ResourceExhausted)
	}

	srv.Kill()
	for i := range 3 {
		trailer, err := s.call(t, echoUnary)
		st := wantCode(t, "failing closed with Redis down", err, codes.Unavailable)
		if d := retryDelay(t, st); d != time.Second {
			t.Errorf("call %d failing closed: RetryInfo delay %v, want 1s", i+1, d)
		}
		if got := trailer.Get("ratelimit"); got != nil {
			t.Errorf("call %d failing closed: trailer ratelimit = %q, want none: nothing was decided", i+1, got)
		}
		_, err = s.call(t, otherUnary)
		wantCode(t, "failing open with Redis down", err, codes.OK)
	}
}
