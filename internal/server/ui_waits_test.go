package server_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// waitsState is the part of GET /ui/api/state the Priorities, Queues and
// Waits booked tables show.
type waitsState struct {
	Priorities []struct {
		Policy, Class              string
		Share                      int
		Allowed, Denied, Undecided int64
	} `json:"priorities"`
	Queues []struct {
		Route        string  `json:"route"`
		Queued       int64   `json:"queued"`
		MeanWaitMS   float64 `json:"mean_wait_ms"`
		PastMaxDelay int64   `json:"past_max_delay"`
		QueueFull    int64   `json:"queue_full"`
		Abandoned    int64   `json:"abandoned"`
	} `json:"queues"`
	Bookings []struct {
		Policy      string  `json:"policy"`
		Waits       int64   `json:"waits"`
		MeanDelayMS float64 `json:"mean_delay_ms"`
	} `json:"bookings"`
}

func readWaits(t *testing.T, url string) (waitsState, string) {
	t.Helper()
	code, body, _ := get(t, url+"/ui/api/state", "")
	var st waitsState
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("GET /ui/api/state = %d %v: %s", code, err, body)
	}
	return st, body
}

// TestUIWaitsQueuesPriorities: the dashboard's Priorities, Queues and
// Waits booked tables show what the check API and a proxy sharing the
// server's metrics did, over real sockets, in exact numbers. On api (gcra
// burst 4, sheddable 50 %, the store's clock standing still) two
// sheddable checks pass and the third is denied inside the reserve, two
// critical ones take the reserve and the third is denied, and a check
// naming no class counts as default, denied. On paced (1/s) a second
// book waits 1s. Through the proxy (queue, 100/s burst 1, max_delay
// 10ms) the first request passes, the second is held 10ms for its slot,
// the third's slot lies 20ms ahead, past max_delay: 429.
func TestUIWaitsQueuesPriorities(t *testing.T) {
	policies := []sluice.Policy{
		{ID: "api", Algorithm: sluice.GCRA, Limit: 4, Window: time.Second, Burst: 4, Priorities: map[string]int{"critical": 100, "sheddable": 50}},
		{ID: "paced", Algorithm: sluice.GCRA, Limit: 1, Window: time.Second, Burst: 1, MaxWait: time.Minute},
		{ID: "queue", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 1},
	}
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"api", "paced", "queue"})
	if err != nil {
		t.Fatal(err)
	}
	clock := sluicetest.NewClock()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	f := newFixtureOn(t, &recordingStore{Store: ms}, clock, policies, server.Options{Metrics: m})

	st, _ := readWaits(t, f.url)
	if len(st.Queues) != 0 || len(st.Bookings) != 0 || len(st.Priorities) != 3 || st.Priorities[0].Allowed != 0 {
		t.Fatalf("state before traffic = %+v, want no queues, no bookings, api's three classes at 0", st)
	}

	for _, c := range []struct {
		body string
		code int
	}{
		{`{"policy":"api","subject":"a","priority":"sheddable"}`, 200},
		{`{"policy":"api","subject":"a","priority":"sheddable"}`, 200},
		{`{"policy":"api","subject":"a","priority":"sheddable"}`, 429}, // inside the reserve
		{`{"policy":"api","subject":"a","priority":"critical"}`, 200},
		{`{"policy":"api","subject":"a","priority":"critical"}`, 200},
		{`{"policy":"api","subject":"a","priority":"critical"}`, 429},
		{`{"policy":"api","subject":"a"}`, 429},
		{`{"policy":"paced","subject":"w","op":"book"}`, 200},
		{`{"policy":"paced","subject":"w","op":"book"}`, 200}, // booked 1s ahead
	} {
		if resp, a := f.post(t, c.body); resp.StatusCode != c.code {
			t.Fatalf("POST /v1/check %s = %d %+v, want %d", c.body, resp.StatusCode, a, c.code)
		}
	}

	lim, err := sluice.New(m.InstrumentStore(ms, "memory", clock), policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	p, err := server.NewProxy(&config.Proxy{Upstream: up.URL, LocalShare: config.DefaultLocalShare, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/q"}, Policies: []string{"queue"}, Subject: "ip", MaxDelay: 10 * time.Millisecond},
	}}, lim, server.ProxyOptions{Pseudonymizer: subject.Unkeyed(), Logger: slog.New(slog.DiscardHandler), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	for i, want := range []int{http.StatusCreated, http.StatusCreated, http.StatusTooManyRequests} {
		resp, err := http.Get(ps.URL + "/q")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("proxied request %d = %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	ps.Close() // waits for every handler, so each decision is counted

	st, body := readWaits(t, f.url)
	type prio struct {
		Policy, Class              string
		Share                      int
		Allowed, Denied, Undecided int64
	}
	var gotP []prio
	for _, r := range st.Priorities {
		gotP = append(gotP, prio(r))
	}
	wantP := []prio{
		{"api", "critical", 100, 2, 1, 0},
		{"api", "default", 100, 0, 1, 0},
		{"api", "sheddable", 50, 2, 1, 0},
	}
	if diff := cmp.Diff(wantP, gotP); diff != "" {
		t.Errorf("priorities (-want +got):\n%s\n%s", diff, body)
	}
	if len(st.Queues) != 1 || st.Queues[0].Route != "* /q" || st.Queues[0].Queued != 1 || st.Queues[0].MeanWaitMS != 10 ||
		st.Queues[0].PastMaxDelay != 1 || st.Queues[0].QueueFull != 0 || st.Queues[0].Abandoned != 0 {
		t.Errorf("queues = %+v, want * /q: 1 queued, 10ms mean wait, 1 past max_delay", st.Queues)
	}
	if len(st.Bookings) != 2 || st.Bookings[0].Policy != "paced" || st.Bookings[0].Waits != 1 || st.Bookings[0].MeanDelayMS != 1000 ||
		st.Bookings[1].Policy != "queue" || st.Bookings[1].Waits != 1 || st.Bookings[1].MeanDelayMS != 10 {
		t.Errorf("bookings = %+v, want paced: 1 wait of 1000ms (op book); queue: 1 of 10ms (the proxy's queue)", st.Bookings)
	}
	if strings.Contains(body, `"a"`) || strings.Contains(body, `"w"`) {
		t.Errorf("GET /ui/api/state names a subject: %s", body)
	}
}

// TestUIWaitsWithoutMetrics: a server that counts no metrics answers
// null for the three tables (the page says so), not empty lists.
func TestUIWaitsWithoutMetrics(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	_, body, _ := get(t, f.url+"/ui/api/state", "")
	for _, field := range []string{`"queues":null`, `"bookings":null`, `"priorities":null`} {
		if !strings.Contains(body, field) {
			t.Errorf("GET /ui/api/state without metrics = %s, want %s", body, field)
		}
	}
}

// TestMetricsPriorityLabelBounded: sluice_decisions_by_priority_total
// labels a decision with the class the request named only where the
// policy declares it: a class only another policy declares counts as
// default there, a class no policy declares (Incompatible) never becomes
// a label value, and a policy without classes has no series at all.
func TestMetricsPriorityLabelBounded(t *testing.T) {
	policies := []sluice.Policy{
		{ID: "api", Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Minute, Priorities: map[string]int{"critical": 100, "sheddable": 50}},
		{ID: "bulk", Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Minute, Priorities: map[string]int{"batch": 10}},
		{ID: "plain", Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Minute},
	}
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"api", "bulk", "plain"})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, policies, server.Options{Metrics: m})
	for _, body := range []string{
		`{"policy":"api","subject":"a","priority":"sheddable"}`,
		`{"policy":"api","subject":"a","priority":"batch"}`,                // bulk's class: default on api
		`{"policies":["api","bulk"],"subject":"a","priority":"batch"}`,     // default on api, batch on bulk
		`{"policies":["api","plain"],"subject":"a","priority":"critical"}`, // plain declares none: no series
		`{"policy":"plain","subject":"a"}`,
	} {
		if resp, a := f.post(t, body); resp.StatusCode != 200 {
			t.Fatalf("POST /v1/check %s = %d %+v, want 200", body, resp.StatusCode, a)
		}
	}
	f.check(t, `{"policy":"api","subject":"a","priority":"no-such-class"}`, 422, "must be empty or a class a policy declares")
	got := map[string]float64{}
	for series, v := range scrape(t, m) {
		if strings.HasPrefix(series, "sluice_decisions_by_priority_total{") {
			got[series] = v
		}
	}
	want := map[string]float64{
		`sluice_decisions_by_priority_total{outcome="allowed",policy="api",priority="sheddable"}`:    1,
		`sluice_decisions_by_priority_total{outcome="allowed",policy="api",priority="default"}`:      2,
		`sluice_decisions_by_priority_total{outcome="allowed",policy="bulk",priority="batch"}`:       1,
		`sluice_decisions_by_priority_total{outcome="allowed",policy="api",priority="critical"}`:     1,
		`sluice_decisions_by_priority_total{outcome="incompatible",policy="api",priority="default"}`: 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sluice_decisions_by_priority_total (-want +got):\n%s", diff)
	}
	if _, text, _ := get(t, f.url+"/metrics", ""); strings.Contains(text, "no-such-class") {
		t.Errorf("/metrics names the class no policy declares")
	}
}
