package httplimit_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// redisHarness serves the middleware over a redisstore on a server of its
// own (the tests stop and pause it), with Redis TIME as the clock.
func redisHarness(t *testing.T, opts httplimit.Options, policies ...sluice.Policy) (*harness, *redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Standalone(t)
	// The client an application would configure: deadlines reach the socket.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	st, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	if opts.Deadline == 0 {
		// Generous, so a loaded machine never fails the calls Redis answers;
		// the failure cases wait it out.
		opts.Deadline = 2 * time.Second
	}
	return newHarnessStore(t, sluicetest.NewClock(sluicetest.Start), st, policies, opts), srv, srv.Client()
}

func failureRoutes() httplimit.Options {
	return httplimit.Options{
		Routes: []httplimit.Route{
			{PathPrefix: "/closed", Policies: []string{"closed"}},
			{PathPrefix: "/open", Policies: []string{"open"}},
			{PathPrefix: "/local", Policies: []string{"local"}},
		},
		Sources: []httplimit.Source{httplimit.FromIP},
	}
}

func failurePolicies() []sluice.Policy {
	return []sluice.Policy{
		policy("closed", sluice.FixedWindow, 3, 10*time.Second, sluice.FailClosed),
		policy("open", sluice.FixedWindow, 3, 10*time.Second, sluice.FailOpen),
		policy("local", sluice.FixedWindow, 8, time.Minute, sluice.FailLocal),
	}
}

// expectStatus checks that a request is answered with want without waiting
// much past the deadline (a generous bound: machines are shared).
func expectStatus(t *testing.T, h *harness, path string, want int) response {
	t.Helper()
	start := time.Now()
	resp := h.do("GET", path)
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("GET %s answered after %v, want about the deadline", path, elapsed)
	}
	if resp.StatusCode != want {
		t.Fatalf("GET %s = %d (%s), want %d", path, resp.StatusCode, resp.body, want)
	}
	return resp
}

func TestRedisStopped(t *testing.T) {
	h, srv, _ := redisHarness(t, failureRoutes(), failurePolicies()...)
	expectStatus(t, h, "/closed", 200)
	srv.Stop()
	resp := expectStatus(t, h, "/closed", 503)
	wantProblem(t, resp, 503)
	retryAfter(t, resp)
	// Nothing can have been sent: unavailable, whether the deadline ran out
	// while go-redis retried the dial or the dial error came first.
	if d := h.last(); d.Outcome.Kind != sluice.Unavailable || (d.Outcome.Cause != sluice.FailedBeforeSend && d.Outcome.Cause != sluice.DeadlinePassed) {
		t.Errorf("with Redis stopped: outcome %v/%v (%v), want unavailable, nothing sent", d.Outcome.Kind, d.Outcome.Cause, d.Outcome.Err)
	}
	expectStatus(t, h, "/open", 200)
	var got []int
	for range 4 {
		got = append(got, h.do("GET", "/local").StatusCode)
	}
	if diff := cmp.Diff([]int{200, 200, 429, 429}, got); diff != "" {
		t.Errorf("local fallback with Redis stopped (share 0.25 of 8): statuses diff (-want +got):\n%s", diff)
	}
}

// TestRedisNeverReplies pauses the server (SIGSTOP): connections are still
// accepted by the kernel, but nothing answers.
func TestRedisNeverReplies(t *testing.T) {
	h, srv, _ := redisHarness(t, failureRoutes(), failurePolicies()...)
	expectStatus(t, h, "/closed", 200)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	resp := expectStatus(t, h, "/closed", 503)
	wantProblem(t, resp, 503)
	retryAfter(t, resp)
	if d := h.last(); d.Outcome.Kind != sluice.Indeterminate && d.Outcome.Kind != sluice.Unavailable {
		t.Errorf("with Redis silent: outcome %v (%v), want indeterminate or unavailable", d.Outcome.Kind, d.Outcome.Err)
	}
	expectStatus(t, h, "/open", 200)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
}

func TestRedisCorruptCounter(t *testing.T) {
	h, _, admin := redisHarness(t, failureRoutes(), failurePolicies()...)
	defer admin.Close()
	ctx := context.Background()
	expectStatus(t, h, "/closed", 200)
	keys, err := admin.Keys(ctx, "sluice:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys after one decision = %q, %v; want exactly one", keys, err)
	}
	// A hand-written INCR counter where sluice keeps its own state.
	if err := admin.Set(ctx, keys[0], "41", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	resp := expectStatus(t, h, "/closed", 503)
	wantProblem(t, resp, 503)
	d := h.last()
	if d.Outcome.Kind != sluice.Unavailable || d.Outcome.Cause != sluice.CorruptState || d.Action != httplimit.FailedClosed {
		t.Errorf("corrupt counter: decision %v/%v (%v), want failed closed on an unavailable outcome (corrupt_state)", d.Action, d.Outcome.Kind, d.Outcome.Err)
	}
	if logs := h.logs.String(); !strings.Contains(logs, "SLUICE_CORRUPT") || !strings.Contains(logs, "want 3 integers") {
		t.Errorf("logs %s: want the reason (SLUICE_CORRUPT … want 3 integers)", logs)
	}
	if v, _ := admin.Get(ctx, keys[0]).Result(); v != "41" {
		t.Errorf("the corrupt key now holds %q: a failed decision must write nothing", v)
	}
}

// TestRawIdentityNeverInRedis sends requests identified by an API key, an
// IP with a User-Agent, and a principal, then reads every key in Redis.
func TestRawIdentityNeverInRedis(t *testing.T) {
	const apiKey, principal, agent = "sk_live_raw_api_key_4242", "alice@example.com", "RawAgent/9.9"
	opts := httplimit.Options{
		Routes:       []httplimit.Route{{Policies: []string{"api"}}},
		APIKeyHeader: "X-API-Key",
		Principal: func(r *http.Request) (string, bool) {
			p := r.Header.Get("X-Principal")
			return p, p != ""
		},
	}
	h, _, admin := redisHarness(t, opts, policy("api", sluice.GCRA, 10, time.Second, sluice.FailClosed))
	defer admin.Close()
	expectStatus(t, h, "/", 200)
	h.do("GET", "/", "User-Agent: "+agent)
	h.do("GET", "/", "X-API-Key: "+apiKey)
	h.do("GET", "/", "X-Principal: "+principal)
	keys, err := admin.Keys(context.Background(), "*").Result()
	if err != nil || len(keys) < 3 {
		t.Fatalf("keys = %q, %v; want one per subject", keys, err)
	}
	for _, k := range keys {
		for _, raw := range []string{apiKey, principal, "alice", agent, "RawAgent", "127.0.0.1"} {
			if strings.Contains(k, raw) {
				t.Errorf("Redis key %q contains the raw identity %q", k, raw)
			}
		}
	}
}
