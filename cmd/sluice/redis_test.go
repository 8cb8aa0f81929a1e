package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestTwoServersShareRedis runs two `sluice serve` instances against one
// real redis-server: the 3-per-window demo policy answers 200, 200, 200,
// 429 across both, and /readyz reports the store, then its loss.
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
	ready := func(s *served) int {
		resp, err := http.Get(s.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := ready(a); code != 200 {
		t.Fatalf("GET /readyz with Redis up = %d, want 200", code)
	}
	srv.Stop()
	if code := ready(a); code != 503 {
		t.Fatalf("GET /readyz with Redis stopped = %d, want 503", code)
	}
	for _, s := range []*served{a, b} {
		if err := s.stop(); err != nil {
			t.Fatalf("serve after cancel: %v", err)
		}
	}
}
