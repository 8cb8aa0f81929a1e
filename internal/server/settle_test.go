package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
)

// TestCheckAPISettle: "op": "estimate" spends, "op": "settle" replaces it
// with the actual cost and answers what it charged, gave back and left
// owed (a retry the same, replayed); what cannot be settled is refused
// with its reason; the settles are counted on sluice_settled_units_total.
// Every exchange is validated against openapi.yaml (the fixture's
// handler is wrapped in validating).
func TestCheckAPISettle(t *testing.T) {
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"tokens", "broad"})
	if err != nil {
		t.Fatal(err)
	}
	policies := []sluice.Policy{
		{ID: "tokens", Algorithm: sluice.TokenBucket, Limit: 100, Window: time.Hour, DedupeTTL: time.Minute},
		{ID: "broad", Algorithm: sluice.SlidingWindow, Limit: 100, Window: time.Minute},
	}
	f := newFixture(t, policies, server.Options{Metrics: m})
	if resp, a := f.post(t, `{"policy":"tokens","subject":"alice","op":"estimate","cost":40,"evaluation_id":"call-1"}`); resp.StatusCode != 200 || a.Remaining != 60 {
		t.Fatalf("estimate of 40: %d %+v, want 200 with 60 left", resp.StatusCode, a)
	}
	resp, a := f.post(t, `{"policy":"tokens","subject":"alice","op":"settle","cost":10,"evaluation_id":"call-1"}`)
	if resp.StatusCode != 200 || a.GivenBack != 30 || a.Charged != 0 || a.Remaining != 90 || a.Replayed != nil {
		t.Fatalf("settle at 10: %d %+v, want 200, 30 given back, 90 left", resp.StatusCode, a)
	}
	if _, a := f.post(t, `{"policy":"tokens","subject":"alice","op":"settle","cost":99,"evaluation_id":"call-1"}`); a.GivenBack != 30 || a.Replayed == nil {
		t.Fatalf("retried settle: %+v, want the first answer, replayed", a)
	}
	f.post(t, `{"policy":"tokens","subject":"alice","op":"estimate","cost":90,"evaluation_id":"call-2"}`)
	if _, a := f.post(t, `{"policy":"tokens","subject":"alice","op":"settle","cost":150,"evaluation_id":"call-2"}`); a.Charged != 60 || a.Owed != 60 || a.Remaining != 0 {
		t.Fatalf("settle 90 → 150 with nothing left: %+v, want 60 charged, 60 owed", a)
	}
	f.check(t, `{"policy":"tokens","subject":"alice","op":"settle","cost":1,"evaluation_id":"never"}`, 400, "no estimate to settle")
	f.check(t, `{"policy":"tokens","subject":"alice","op":"settle","evaluation_id":"call-3"}`, 400, "cost is required")
	f.check(t, `{"policy":"tokens","subject":"alice","op":"estimate","cost":1}`, 400, "evaluation_id is required")
	f.check(t, `{"policy":"tokens","subject":"alice","op":"borrow","evaluation_id":"x"}`, 400, "must be estimate, settle or book")
	f.check(t, `{"policy":"broad","subject":"alice","op":"estimate","evaluation_id":"x"}`, 422, "refund not supported")
	raw, err := http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Body.Close()
	text, _ := io.ReadAll(raw.Body)
	got := parseExposition(t, string(text))
	for series, want := range map[string]float64{
		`sluice_settled_units_total{kind="charged",policy="tokens"}`:    60,
		`sluice_settled_units_total{kind="given_back",policy="tokens"}`: 30,
		`sluice_settled_units_total{kind="owed",policy="tokens"}`:       60,
		`sluice_decisions_total{outcome="allowed",policy="tokens"}`:     2, // the estimates
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
	// The dashboard's Settles table reads the same counters: one row for
	// tokens, none for broad, which settled nothing.
	code, body, _ := get(t, f.url+"/ui/api/state", "")
	var st struct {
		Settles []struct {
			Policy                   string
			Charged, GivenBack, Owed int64
		} `json:"settles"`
	}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("GET /ui/api/state = %d %v", code, err)
	}
	if len(st.Settles) != 1 || st.Settles[0].Policy != "tokens" || st.Settles[0].Charged != 60 || st.Settles[0].Owed != 60 || !strings.Contains(body, `"given_back":30`) {
		t.Errorf("/ui/api/state settles = %s, want tokens: 60 charged, 30 given back, 60 owed", body)
	}
}

// TestUIStateSettlesWithoutSettles: a server with metrics and no settle
// answers an empty list (the page says "none yet"), without creating a
// series of sluice_settled_units_total.
func TestUIStateSettlesWithoutSettles(t *testing.T) {
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"demo", "login", "api", "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, demoPolicies, server.Options{Metrics: m})
	if _, body, _ := get(t, f.url+"/ui/api/state", ""); !strings.Contains(body, `"settles":[]`) {
		t.Errorf("/ui/api/state = %s, want an empty settles list", body)
	}
	if _, text, _ := get(t, f.url+"/metrics", ""); strings.Contains(text, "sluice_settled_units_total{") {
		t.Errorf("/metrics has a settled series after the dashboard read it, before any settle")
	}
}
