package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestTwoServersShareRedis runs two `sluice serve` instances against one
// real redis-server: the 3-per-window demo policy answers 200, 200, 200,
// 429 across both; /readyz and /readyz/store report the store, then its
// loss (demo fails closed: nothing answers without the store).
func TestTwoServersShareRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	cfg := writeConfig(t, fmt.Sprintf(`
server:
  listen: "127.0.0.1:0"
store:
  type: redis
  redis: { url: "redis://%s/0" }
policies:
  - id: demo
    algorithm: fixed_window
    limit: 3
    window: 1h
`, srv.Addr))
	a := startServe(t, "-c", cfg)
	b := startServe(t, "-c", cfg)
	var got []int
	for i, s := range []*served{a, b, a, b} {
		resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"alice"}`))
		if err != nil {
			t.Fatalf("check #%d: %v", i+1, err)
		}
		resp.Body.Close()
		got = append(got, resp.StatusCode)
	}
	if fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("four checks alternating between two servers on one Redis = %v, want [200 200 200 429]", got)
	}
	ready := func(s *served, path string) int {
		resp, err := http.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/readyz", "/readyz/store"} {
		if code := ready(a, path); code != 200 {
			t.Fatalf("GET %s with Redis up = %d, want 200", path, code)
		}
	}
	srv.Stop()
	for _, path := range []string{"/readyz", "/readyz/store"} {
		if code := ready(a, path); code != 503 {
			t.Fatalf("GET %s with Redis stopped = %d, want 503", path, code)
		}
	}
	for _, s := range []*served{a, b} {
		if err := s.stop(); err != nil {
			t.Fatalf("serve after cancel: %v", err)
		}
	}
}

// TestServeStartsWithRedisDown: serve starts while its Redis is down,
// answers per failure mode (503 for a closed policy, 200 for an open one),
// /readyz/store says 503 but /readyz 200 (the open policy is answered
// without the store); once Redis is back, decisions are taken there and
// both say 200.
func TestServeStartsWithRedisDown(t *testing.T) {
	srv := redistest.Standalone(t)
	srv.Kill()
	cfg := writeConfig(t, fmt.Sprintf(`
server:
  listen: "127.0.0.1:0"
store:
  type: redis
  redis: { url: "redis://%s/0" }
policies:
  - { id: closed, algorithm: fixed_window, limit: 3, window: 1h }
  - { id: open, algorithm: fixed_window, limit: 3, window: 1h, failure_mode: open }
`, srv.Addr))
	s := startServe(t, "-c", cfg)
	status := func(method, path, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := status("GET", "/readyz/store", ""); code != 503 {
		t.Fatalf("GET /readyz/store with Redis down = %d, want 503", code)
	}
	if code := status("GET", "/readyz", ""); code != 200 {
		t.Fatalf("GET /readyz with Redis down and a policy failing open = %d, want 200", code)
	}
	// The figure RELIABILITY.md quotes (logged, not asserted): how long the
	// first checks against a refused connection take, before the breaker
	// opens.
	var took []time.Duration
	for range 5 {
		start := time.Now()
		if code := status("POST", "/v1/check", `{"policy":"closed","subject":"alice"}`); code != 503 {
			t.Fatalf("check of a closed policy with Redis down = %d, want 503", code)
		}
		took = append(took, time.Since(start))
	}
	t.Logf("first five checks with Redis refusing connections answered in %v", took)
	if code := status("POST", "/v1/check", `{"policy":"open","subject":"alice"}`); code != 503 {
		// The check API answers what the store said; failure modes are
		// the edge's (proxy, middleware) to apply.
		t.Fatalf("check of an open policy with Redis down = %d, want 503 (unavailable)", code)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	code := 0
	for range 100 { // go-redis dials again on its own schedule
		if code = status("POST", "/v1/check", `{"policy":"closed","subject":"alice"}`); code != 503 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != 200 {
		t.Fatalf("check once Redis is back = %d, want 200", code)
	}
	for _, path := range []string{"/readyz", "/readyz/store"} {
		if code := status("GET", path, ""); code != 200 {
			t.Fatalf("GET %s once Redis is back = %d, want 200", path, code)
		}
	}
}
