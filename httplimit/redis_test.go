package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
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
	return newHarnessStore(t, sluicetest.NewClock(), st, policies, opts), srv, srv.Client()
}

func failureRoutes() httplimit.Options {
	return httplimit.Options{
		Routes: []httplimit.Route{
			{PathPrefix: "/closed", Policies: []string{"closed"}},
			{PathPrefix: "/open", Policies: []string{"open"}, FailureMode: failure.Open},
			{PathPrefix: "/local", Policies: []string{"local"}, FailureMode: failure.Local},
		},
	}
}

func failurePolicies() []sluice.Policy {
	return []sluice.Policy{
		policy("closed", sluice.FixedWindow, 3, 10*time.Second),
		policy("open", sluice.FixedWindow, 3, 10*time.Second),
		policy("local", sluice.FixedWindow, 8, time.Minute),
	}
}

// expectStatus checks that a request is answered with want (answered at
// all: a stopped Redis is cut off by the deadline; the test's timeout
// bounds a hang).
func expectStatus(t *testing.T, h *harness, path string, want int) response {
	t.Helper()
	resp := h.do("GET", path)
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
	if d.Outcome.Kind != sluice.Unavailable || d.Outcome.Cause != sluice.CorruptState || d.Action != "failed_closed" {
		t.Errorf("corrupt counter: decision %v/%v (%v), want failed closed on an unavailable outcome (corrupt_state)", d.Action, d.Outcome.Kind, d.Outcome.Err)
	}
	if logs := h.logs.String(); !strings.Contains(logs, "SLUICE_CORRUPT") || !strings.Contains(logs, "want 2 integers") {
		t.Errorf("logs %s: want the reason (SLUICE_CORRUPT … want 2 integers)", logs)
	}
	if v, _ := admin.Get(ctx, keys[0]).Result(); v != "41" {
		t.Errorf("the corrupt key now holds %q: a failed decision must write nothing", v)
	}
}

// TestRawIdentityNeverInRedis sends requests identified by an API key, an
// IP with a User-Agent, and a principal, then reads every key in Redis.
func TestRawIdentityNeverInRedis(t *testing.T) {
	const apiKey, principal, agent = "sk_live_raw_api_key_4242", "alice@example.com", "RawAgent/9.9"
	key, err := subject.Header("X-API-Key")
	if err != nil {
		t.Fatal(err)
	}
	opts := httplimit.Options{
		Routes: []httplimit.Route{{Policies: []string{"api"}}},
		Subject: subject.FirstOf(
			subject.Principal(func(r *http.Request) (string, bool) {
				p := r.Header.Get("X-Principal")
				return p, p != ""
			}),
			key,
			ipUserAgent(nil),
		),
	}
	// 10 per hour: a key lives 6 minutes after a spend. At 10 per second
	// (100ms), a loaded machine read the keys after some had expired.
	h, _, admin := redisHarness(t, opts, policy("api", sluice.GCRA, 10, time.Hour))
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

// TestRedisKeyRotation: adding a new HMAC key in front of the old one
// carries each caller's budget over, over real sockets and a real Redis;
// replacing the key outright would have started every caller afresh.
func TestRedisKeyRotation(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	st, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := sluice.New(st, []sluice.Policy{{ID: "api", Algorithm: sluice.SlidingLog, Limit: 5, Window: time.Hour}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k1 := subject.Key{ID: "k1", Secret: []byte("first-secret-0123456789")}
	k2 := subject.Key{ID: "k2", Secret: []byte("second-secret-0123456789")}
	serve := func(keys ...subject.Key) string {
		pseudo, err := subject.New(keys)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := httplimit.New(lim, httplimit.Options{
			Routes:        []httplimit.Route{{PathPrefix: "/", Policies: []string{"api"}}},
			Pseudonymizer: pseudo,
		})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
		t.Cleanup(ts.Close)
		return ts.URL
	}
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("RateLimit")
	}
	before, rotating, replaced := serve(k1), serve(k2, k1), serve(k2)
	for range 3 {
		get(before)
	}
	if code, rl := get(rotating); code != 200 || !strings.Contains(rl, "r=1") {
		t.Fatalf("4th request under keys [k2, k1] = %d, RateLimit %q; want 200 with r=1: the k1 budget carried over", code, rl)
	}
	if code, rl := get(rotating); code != 200 || !strings.Contains(rl, "r=0") {
		t.Fatalf("5th request = %d, RateLimit %q; want 200 with r=0", code, rl)
	}
	if code, _ := get(rotating); code != 429 {
		t.Fatalf("6th request = %d, want 429: the limit of 5 held across the rotation", code)
	}
	if code, _ := get(replaced); code != 429 {
		t.Fatalf("request under k2 alone after the rotation = %d, want 429: the carried state is kept under k2", code)
	}
}
