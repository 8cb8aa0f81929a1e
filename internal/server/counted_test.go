package server_test

import (
	"encoding/json"
	"fmt"
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
	wantCounted(t, s, []string{id}, id)
}

// TestServeEnvoyAndPoliciesCounted serves a config with policies of its
// own and an envoy section: the dashboard lists both files' policies,
// and the Envoy service's decisions count under the rule's policy ID.
func TestServeEnvoyAndPoliciesCounted(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": envoyConfig(""), "rules/shop.yaml": rulesFile(3)})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	for range 5 {
		remaining(t, c, "alice")
	}
	// 4 allowed: the check API decides the config's own policy, which
	// counts apart.
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"bob"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := metricValue(t, s, `sluice_decisions_total{outcome="allowed",policy="demo"}`); got != "1" {
		t.Errorf("demo allowed = %q, want 1", got)
	}
	wantCounted(t, s, []string{"demo", "shop.user"}, "shop.user", "demo")
}

// wantCounted checks that policy counted 3 allowed spends of the Envoy
// service (4 with the check on it, when only it is served) and 2 denials in
// /metrics and /ui/api/state, and that the dashboard lists exactly ids.
func wantCounted(t *testing.T, s *running, ids []string, id string, others ...string) {
	t.Helper()
	allowed := "4"
	if len(others) > 0 {
		allowed = "3"
	}

	for series, want := range map[string]string{
		`sluice_decisions_total{outcome="allowed",policy="` + id + `"}`: allowed,
		`sluice_decisions_total{outcome="denied",policy="` + id + `"}`:  "2",
		`sluice_decisions_total{outcome="allowed",policy="(unknown)"}`:  "",
	} {
		if got := metricValue(t, s, series); got != want {
			t.Errorf("GET /metrics: %s = %q, want %q", series, got, want)
		}
	}

	resp, err := http.Get(s.url + "/ui/api/state")
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
	var listed []string
	for _, p := range st.Policies {
		listed = append(listed, p.ID)
	}
	if strings.Join(listed, ",") != strings.Join(ids, ",") {
		t.Errorf("GET /ui/api/state: policies %q, want %q", listed, ids)
	}
	found := false
	for _, l := range st.Live {
		if l.Policy == id {
			found = true
			if fmt.Sprint(l.Total["allowed"]) != allowed || l.Total["denied"] != 2 {
				t.Errorf("GET /ui/api/state: live %+v, want %s allowed and 2 denied", l, allowed)
			}
		}
	}
	if !found {
		t.Errorf("GET /ui/api/state: live %+v, want a series of %s", st.Live, id)
	}
}
