package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// dashboardState is the part of GET /ui/api/state this test reads.
type dashboardState struct {
	Store struct {
		Type      string   `json:"type"`
		Ready     bool     `json:"ready"`
		Error     string   `json:"error"`
		LatencyMS *float64 `json:"latency_ms"`
		Breaker   string   `json:"breaker"`
	} `json:"store"`
	Config struct {
		Generation int64 `json:"generation"`
	} `json:"config"`
	Live []struct {
		Policy string           `json:"policy"`
		Total  map[string]int64 `json:"total"`
	} `json:"live"`
}

// TestDashboardStoreHealthOnRedis: the dashboard reports a real Redis as
// reachable with its round-trip time and a closed breaker; once Redis is
// gone, unreachable, the breaker open after the failures serve counted,
// and those decisions as unavailable.
func TestDashboardStoreHealthOnRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	s := startServe(t, "-c", writeConfig(t, fmt.Sprintf(`
server:
  listen: "127.0.0.1:0"
store:
  type: redis
  redis: { url: "redis://%s/0" }
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
`, srv.Addr)))
	state := func() dashboardState {
		t.Helper()
		resp, err := http.Get(s.url + "/ui/api/state")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st dashboardState
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	check := func() int {
		t.Helper()
		resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"alice"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	check()
	st := state()
	if st.Store.Type != "redis" || !st.Store.Ready || st.Store.LatencyMS == nil || st.Store.Breaker != "closed" || st.Config.Generation != 1 {
		t.Errorf("state with Redis up: store %+v, generation %d; want redis, ready, a latency, breaker closed, generation 1", st.Store, st.Config.Generation)
	}

	srv.Kill()
	failed := 0
	for range 50 { // the breaker opens after 5 failures in a row
		if check() == 503 {
			failed++
		}
		if state().Store.Breaker == "open" {
			break
		}
	}
	st = state()
	if st.Store.Ready || st.Store.Error == "" || st.Store.Breaker != "open" {
		t.Errorf("state with Redis killed: store %+v; want unreachable with the reason, breaker open", st.Store)
	}
	// A decision sent on a pooled connection before the client saw the
	// kill's reset is indeterminate (sent, no reply), also a 503: on a
	// loaded machine that can happen.
	if len(st.Live) != 1 || st.Live[0].Total["allowed"] != 1 || st.Live[0].Total["unavailable"]+st.Live[0].Total["indeterminate"] != int64(failed) || failed == 0 {
		t.Errorf("live with Redis killed: %+v; want 1 allowed and the %d 503 answers unavailable (or indeterminate)", st.Live, failed)
	}
}
