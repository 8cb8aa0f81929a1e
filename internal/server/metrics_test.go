package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/sluicetest"
)

func TestCheckAPIMetrics(t *testing.T) {
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"demo", "login", "api", "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, demoPolicies, server.Options{Metrics: m})
	for range 4 {
		f.post(t, `{"policy":"demo","subject":"alice@example.com"}`)
	}
	f.post(t, `{"policy":"demo","subject":"alice@example.com","cost":0}`)            // a peek: not a decision
	f.post(t, `{"policy":"demo","subject":"bob","refund":true}`)                     // a refund: not a decision
	f.post(t, `{"policy":"no-such-policy-for-alice","subject":"alice@example.com"}`) // unknown: bounded label
	f.post(t, `{"policies":["login","demo"],"subject":"carol"}`)                     // one count per policy
	f.post(t, `{"policy":"demo","subject":"alice@example.com","cost":-1}`)           // 400: no decision
	resp, err := http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	got := parseExposition(t, text)
	for series, want := range map[string]float64{
		`sluice_decisions_total{outcome="allowed",policy="demo"}`:           4,
		`sluice_decisions_total{outcome="denied",policy="demo"}`:            1,
		`sluice_decisions_total{outcome="allowed",policy="login"}`:          1,
		`sluice_decisions_total{outcome="incompatible",policy="(unknown)"}`: 1,
		`sluice_decisions_total{outcome="unavailable",policy="api"}`:        0,
		`sluice_http_requests_total{code="200",handler="POST /v1/check"}`:   5,
		`sluice_http_requests_total{code="429",handler="POST /v1/check"}`:   2, // the 4th and the peek at the exhausted window
		`sluice_http_requests_total{code="404",handler="POST /v1/check"}`:   1,
		`sluice_http_requests_total{code="400",handler="POST /v1/check"}`:   1,
		`sluice_decision_duration_seconds{store="memory"}_count`:            0, // the fixture's store is not instrumented
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
	for _, raw := range []string{"alice", "bob", "carol", "no-such-policy"} {
		if strings.Contains(text, raw) {
			t.Errorf("/metrics holds %q:\n%s", raw, text)
		}
	}
	// The first scrape is counted once it is answered.
	if got := parseExposition(t, scrapeText(t, f.url))[`sluice_http_requests_total{code="200",handler="GET /metrics"}`]; got != 1 {
		t.Errorf("scrapes counted: %v, want 1", got)
	}
}

func TestNoMetricsWithoutMetrics(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	resp, err := http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("GET /metrics without Metrics = %d, want 404", resp.StatusCode)
	}
}

func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStoreFailureMetrics: an instrumented store's failures are counted per
// cause, from a fixed set of label values.
// TestNearCacheMetrics: a flood on a near_cache policy counts the denials
// answered without the store.
func TestNearCacheMetrics(t *testing.T) {
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"tiny"})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, []sluice.Policy{{ID: "tiny", Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Hour, NearCache: true}}, server.Options{Metrics: m})
	for range 5 {
		f.post(t, `{"policy":"tiny","subject":"mallory"}`)
	}
	got := scrape(t, m)
	for series, want := range map[string]float64{
		`sluice_decisions_total{outcome="allowed",policy="tiny"}`: 1,
		`sluice_decisions_total{outcome="denied",policy="tiny"}`:  4,
		`sluice_near_cache_denials_total{policy="tiny"}`:          3, // the first denial asked the store
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}

func TestStoreFailureMetrics(t *testing.T) {
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"demo"})
	if err != nil {
		t.Fatal(err)
	}
	clock := sluicetest.NewClock()
	ctx := context.Background()
	for _, e := range []error{
		fmt.Errorf("test: %w", sluice.CorruptState),
		fmt.Errorf("test: %w", sluice.CorruptState),
		sluice.CircuitOpen,
		fmt.Errorf("test: read: %w: %w", sluice.ErrIndeterminate, context.DeadlineExceeded),
		errors.New("test: something else"),
	} {
		st := m.InstrumentStore(failingStore{e}, "redis", clock)
		st.Evaluate(ctx, &sluice.Evaluation{Subject: "s"})
	}
	got := scrape(t, m)
	for series, want := range map[string]float64{
		`sluice_store_failures_total{cause="corrupt_state",store="redis"}`: 2,
		`sluice_store_failures_total{cause="circuit_open",store="redis"}`:  1,
		`sluice_store_failures_total{cause="indeterminate",store="redis"}`: 1,
		`sluice_store_failures_total{cause="other",store="redis"}`:         1,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}
