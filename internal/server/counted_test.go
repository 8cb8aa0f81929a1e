package server_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeEnvoyOnlyCounted serves a config with only an envoy section
// and finds the rate-limit service's decisions, sent over a real gRPC
// socket, in sluice_decisions_total and GET /ui/api/state under the
// rule's policy ID, as it finds a check API decision on that policy: the
// edge core counts every decision once, whatever edge took it and
// whichever file defined the policy.
func TestServeEnvoyOnlyCounted(t *testing.T) {
	dir := t.TempDir()
	cfg := "server: { listen: \"127.0.0.1:0\" }\nenvoy:\n  listen: \"127.0.0.1:0\"\n  configs: [\"rules/*.yaml\"]\n"
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg, "rules/shop.yaml": rulesFile(3)})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	const id = "shop.user" // the rule's policy ID: domain and key
	for range 5 {
		remaining(t, c, "alice") // 3 allowed, then 2 over the limit
	}
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"`+id+`","subject":"bob"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/check on policy %s = %d, want 200", id, resp.StatusCode)
	}

	for series, want := range map[string]string{
		`sluice_decisions_total{outcome="allowed",policy="` + id + `"}`: "4",
		`sluice_decisions_total{outcome="denied",policy="` + id + `"}`:  "2",
		`sluice_decisions_total{outcome="allowed",policy="(unknown)"}`:  "",
	} {
		if got := metricValue(t, s, series); got != want {
			t.Errorf("GET /metrics: %s = %q, want %q", series, got, want)
		}
	}

	resp, err = http.Get(s.url + "/ui/api/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Policies []struct {
			ID string `json:"id"`
		} `json:"policies"`
		Live []struct {
			Policy string           `json:"policy"`
			Total  map[string]int64 `json:"total"`
		} `json:"live"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("GET /ui/api/state: %v", err)
	}
	if len(st.Policies) != 1 || st.Policies[0].ID != id {
		t.Errorf("GET /ui/api/state: policies %+v, want only %s", st.Policies, id)
	}
	if len(st.Live) != 1 || st.Live[0].Policy != id || st.Live[0].Total["allowed"] != 4 || st.Live[0].Total["denied"] != 2 {
		t.Errorf("GET /ui/api/state: live %+v, want %s with 4 allowed and 2 denied", st.Live, id)
	}
}
