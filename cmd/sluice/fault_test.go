package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/faultproxy"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestServeRedisHangs: sluice serve in front of a Redis that hangs (a
// fault proxy that accepts connections and never answers), under load,
// with the store's health (/readyz/store) polled throughout. One row per
// edge: the check API (was TestServeRedisHangs) and the proxy (was
// TestServeProxyRedisHangs: a fail-closed route and a fail-open one).
// Each run holds:
//
//   - every answer is one the edge may give while Redis hangs (the row's
//     want: 200 or 503 with the outcome the store typed; for the proxy,
//     503 on the fail-closed route, forwarded on the fail-open one);
//   - nothing waits on the hung Redis: the hang lasts until the edge has
//     shown it (the breaker has opened and shed, each worker whose 503 is
//     a failure answered 503, /readyz/store said 503), then
//     the load stops and every request begun during the hang is answered
//     while Redis still hangs (server.decision_timeout and the store's
//     timeout end them, not Redis);
//   - /readyz/store says 503 from the first failed answer until Redis is
//     back, and 200 again once it is;
//   - once Redis is back the edge decides by it again (20 answers in a
//     row per worker);
//   - the row's own after-check (the check API: a check whose reply was
//     lost, retried with its evaluation_id, is spent once: the budget
//     spent equals the checks allowed);
//   - no goroutine outlives the server.
//
// Latencies and the time to recover are logged, not asserted;
// RELIABILITY.md quotes them:
//
//	go test ./cmd/sluice -run 'TestServeRedisHangs/check_API' -v -count=1
//	go test ./cmd/sluice -run 'TestServeRedisHangs/proxy' -v -count=1
func TestServeRedisHangs(t *testing.T) {
	for _, e := range []hangEdge{apiEdge(), proxyEdge()} {
		t.Run(e.name, func(t *testing.T) { runHang(t, e) })
	}
}

// hangEdge is one row: an edge of sluice serve and what it must answer.
type hangEdge struct {
	name string
	// config is serve's configuration beyond server: and store:; upstream
	// is the address of the test's upstream (for a proxy: section).
	config  func(upstream string) string
	workers int
	// send sends worker w's request; seq is new with every request.
	send func(h *hangRun, w int, seq int64) (hangAnswer, error)
	// want says what is wrong with an answer, or "".
	want func(a hangAnswer) string
	// decided reports whether a was decided by Redis (the streak that
	// means recovered counts these).
	decided func(a hangAnswer) bool
	// after holds the row's own promises once the load has stopped.
	after func(t *testing.T, h *hangRun) string
}

// hangAnswer is how one request was answered.
type hangAnswer struct {
	worker int
	id     string // the evaluation id, or the proxied path
	start  time.Time
	took   time.Duration
	code   int
	kind   string // "200 allowed", "/closed 503", …
	remain int64  // a peek's remaining
}

// hangProbe is one GET /readyz/store.
type hangProbe struct {
	start, end time.Time
	code       int
}

// hangRun is one row's processes, traffic and what became of it.
type hangRun struct {
	t      *testing.T
	e      hangEdge
	url    string // serve's API
	proxy  string // serve's proxy, for a proxy: row
	client *http.Client

	mu      sync.Mutex
	answers []hangAnswer
	readyz  []hangProbe
	stop    chan struct{}
	wg      sync.WaitGroup
	seq     atomic.Int64
}

func runHang(t *testing.T, e hangEdge) {
	srv := redistest.Standalone(t)
	before := goroutines() // the Redis process's waiter included
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	up, upstreamSaw := startUpstream(t)
	cfg := writeConfig(t, fmt.Sprintf(`
server: { listen: "127.0.0.1:0" }
store:
  type: redis
  redis: { url: "redis://%s/0", timeout: 500ms }
%s`, p.Addr(), e.config(up.Addr().String())))
	s := startServe(t, "-c", cfg)
	tr := &http.Transport{MaxIdleConnsPerHost: e.workers + 1}
	h := &hangRun{t: t, e: e, url: s.url, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	if m := proxyLine.FindStringSubmatch(s.logs.String()); m != nil {
		h.proxy = m[1]
	}

	h.load()
	h.waitFor("every worker decided by Redis, /readyz/store 200", func() bool { return h.recovered(time.Time{}) })
	shed0, hung := h.shed(), time.Now()
	p.Hang()
	p.Drop()
	h.waitFor("the breaker shed 20, every worker answered 503, /readyz/store 503", func() bool { return h.showsHang(hung, shed0) })
	h.drain() // while Redis still hangs: nothing waits on it
	p.Drop()
	p.Forward()
	back := time.Now()
	h.load()
	h.waitFor("every worker decided by Redis again, /readyz/store 200", func() bool { return h.recovered(back) })
	h.drain()

	figures := h.check(hung, back)
	figures += "; " + e.after(t, h)
	upSaw := upstreamSaw()
	t.Logf("%s, Redis hung behind sluice serve until it showed: %s; upstream received %v", e.name, figures, upSaw)

	if err := s.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	p.Close()
	up.Close()
	tr.CloseIdleConnections()
	for range 100 { // bounded: go-redis's dial probe looks at a closed pool once a second
		if goroutines() <= before {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Errorf("goroutines: %d before, %d after serve stopped:\n%s", before, goroutines(), buf[:runtime.Stack(buf, true)])
}

// startUpstream starts the proxy's upstream, which answers 202 and counts
// the paths it saw.
func startUpstream(t *testing.T) (net.Listener, func() map[string]int) {
	t.Helper()
	var mu sync.Mutex
	saw := map[string]int{}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		saw[r.URL.Path]++
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(l)
	t.Cleanup(func() { up.Close() })
	return l, func() map[string]int { mu.Lock(); defer mu.Unlock(); return maps.Clone(saw) }
}

// load starts the workers and the /readyz/store prober, until drain.
func (h *hangRun) load() {
	h.stop = make(chan struct{})
	for w := range h.e.workers {
		h.wg.Go(func() {
			for {
				select {
				case <-h.stop:
					return
				case <-time.After(5 * time.Millisecond): // pace, not order
				}
				a, err := h.e.send(h, w, h.seq.Add(1))
				if err != nil {
					h.t.Errorf("worker %d: %v", w, err)
					return
				}
				h.mu.Lock()
				h.answers = append(h.answers, a)
				h.mu.Unlock()
			}
		})
	}
	h.wg.Go(func() {
		for {
			select {
			case <-h.stop:
				return
			case <-time.After(100 * time.Millisecond): // pace, not order
			}
			start := time.Now()
			resp, err := h.client.Get(h.url + "/readyz/store")
			if err != nil {
				h.t.Errorf("GET /readyz/store: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			h.mu.Lock()
			h.readyz = append(h.readyz, hangProbe{start, time.Now(), resp.StatusCode})
			h.mu.Unlock()
		}
	})
}

// drain stops the workers and the prober and waits for their requests in
// flight to be answered. Called while Redis hangs, it is the check that
// nothing waits on Redis: a request still waiting when the HTTP client's
// timeout (30s, a bound on a loaded machine) ends it fails the test.
func (h *hangRun) drain() {
	close(h.stop)
	h.wg.Wait()
}

func (h *hangRun) snapshot() []hangAnswer {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.answers)
}

// waitFor polls cond, a bounded number of times: a bound on a loaded
// machine, not a threshold.
func (h *hangRun) waitFor(what string, cond func() bool) {
	h.t.Helper()
	for range 1500 { // 30s at most
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.t.Fatalf("%s: not within 30s", what)
}

// recovered reports whether every worker has had 20 answers decided by
// Redis in a row, and /readyz/store said 200, since from.
func (h *hangRun) recovered(from time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	streak := make([]int, h.e.workers)
	for _, a := range h.answers {
		switch {
		case a.start.Before(from):
		case h.e.decided(a):
			streak[a.worker]++
		default:
			streak[a.worker] = 0
		}
	}
	return slices.Min(streak) >= 20 && slices.ContainsFunc(h.readyz, func(r hangProbe) bool { return r.start.After(from) && r.code == 200 })
}

// showsHang reports whether, since from, the store's breaker has shed
// (sluice_store_failures_total{cause="circuit_open"} has grown by 20 over
// shed0), every worker whose 503 is a failure has had one, and
// /readyz/store said 503 after the first of them.
func (h *hangRun) showsHang(from time.Time, shed0 int) bool {
	if h.shed() < shed0+20 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	failed := make([]bool, h.e.workers)
	var firstFailed time.Time // the end of the first answer the hang failed
	for _, a := range h.answers {
		if a.start.Before(from) || h.e.decided(a) {
			continue
		}
		failed[a.worker] = true
		if end := a.start.Add(a.took); firstFailed.IsZero() || end.Before(firstFailed) {
			firstFailed = end
		}
	}
	for w, f := range failed {
		if !f && !h.e.decided(hangAnswer{worker: w, code: http.StatusServiceUnavailable}) {
			return false // a worker whose 503 would be a failure has had none yet
		}
	}
	return !firstFailed.IsZero() && slices.ContainsFunc(h.readyz, func(r hangProbe) bool { return r.start.After(firstFailed) && r.code == 503 })
}

var shedLine = regexp.MustCompile(`(?m)^sluice_store_failures_total\{cause="circuit_open"[^}]*\} (\d+)$`)

// shed is how many decisions the store's breaker has shed, from /metrics.
func (h *hangRun) shed() int {
	resp, err := h.client.Get(h.url + "/metrics")
	if err != nil {
		h.t.Errorf("GET /metrics: %v", err)
		return 0
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Errorf("GET /metrics: %v", err)
	}
	n := 0
	if m := shedLine.FindSubmatch(raw); m != nil {
		n, _ = strconv.Atoi(string(m[1]))
	}
	return n
}

// check holds the answers and the probes to the promises the edges share
// and returns the figures.
func (h *hangRun) check(hung, back time.Time) string {
	t := h.t
	answers := h.snapshot()
	sort.Slice(answers, func(i, j int) bool { return answers[i].start.Before(answers[j].start) })
	kinds := map[string]int{}
	var maxTook time.Duration
	recovered, firstFailed := back, back
	for _, a := range answers {
		kinds[a.kind]++
		maxTook = max(maxTook, a.took)
		if msg := h.e.want(a); msg != "" {
			t.Errorf("%s %s at %v = %s: %s", h.e.name, a.id, a.start.Sub(hung), a.kind, msg)
		}
		end := a.start.Add(a.took)
		if h.e.decided(a) {
			continue
		}
		if !a.start.Before(back) && end.After(recovered) {
			recovered = end
		}
		if a.start.After(hung) && end.Before(firstFailed) {
			firstFailed = end
		}
	}
	// /readyz/store: 503 from the first answer the hang failed until
	// Redis is back; a probe that straddles a change may say either.
	h.mu.Lock()
	probes := slices.Clone(h.readyz)
	h.mu.Unlock()
	hungProbes := 0
	for _, r := range probes {
		if r.start.After(firstFailed) && r.end.Before(back) {
			hungProbes++
			if r.code != 503 {
				t.Errorf("GET /readyz/store %v into the hang = %d, want 503", r.start.Sub(hung), r.code)
			}
		}
	}
	var list []string
	for k, n := range kinds {
		list = append(list, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(list)
	return fmt.Sprintf("%d answers, max latency %v (decision_timeout 500ms); %s; /readyz/store 503 in %d probes; last failure %v after Redis was back",
		len(answers), maxTook.Round(time.Millisecond), strings.Join(list, ", "), hungProbes, recovered.Sub(back).Round(time.Millisecond))
}

// apiEdge: the check API, one subject per worker, each check with an
// evaluation id of its own, on a limit never reached.
func apiEdge() hangEdge {
	const limit = 1_000_000
	return hangEdge{
		name:    "check API",
		workers: 4,
		config: func(string) string {
			return fmt.Sprintf("policies:\n  - { id: api, algorithm: fixed_window, limit: %d, window: 1h, dedupe_ttl: 1h, dedupe_max: 10000 }\n", limit)
		},
		send: func(h *hangRun, w int, seq int64) (hangAnswer, error) {
			return apiCheck(h, w, fmt.Sprintf("w%d-%d", w, seq), 1)
		},
		want: func(a hangAnswer) string {
			switch a.kind {
			case "200 allowed", "503 unavailable", "503 indeterminate":
				return ""
			}
			return "want 200 allowed, 503 unavailable or 503 indeterminate"
		},
		decided: func(a hangAnswer) bool { return a.code == 200 },
		after:   apiSpentOnce,
	}
}

// apiCheck sends one check (a peek, without an id, when cost is 0).
func apiCheck(h *hangRun, w int, id string, cost int) (hangAnswer, error) {
	body := fmt.Sprintf(`{"policy":"api","subject":"worker-%d","evaluation_id":%q,"cost":%d}`, w, id, cost)
	if id == "" {
		body = fmt.Sprintf(`{"policy":"api","subject":"worker-%d","cost":%d}`, w, cost)
	}
	a := hangAnswer{worker: w, id: id, start: time.Now()}
	resp, err := h.client.Post(h.url+"/v1/check", "application/json", strings.NewReader(body))
	a.took = time.Since(a.start)
	if err != nil {
		return a, err
	}
	defer resp.Body.Close()
	var out struct {
		Outcome   string `json:"outcome"`
		Remaining int64  `json:"remaining"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return a, err
	}
	a.code, a.kind, a.remain = resp.StatusCode, fmt.Sprintf("%d %s", resp.StatusCode, out.Outcome), out.Remaining
	return a, nil
}

// apiSpentOnce: nothing spent twice. Each check whose reply was lost
// (503 indeterminate) is retried with its id and allowed, and each
// worker's budget spent equals its checks allowed.
func apiSpentOnce(t *testing.T, h *hangRun) string {
	allowedBy := make([]int64, h.e.workers)
	lost, replays := 0, 0
	for _, a := range h.snapshot() {
		switch a.kind {
		case "200 allowed":
			allowedBy[a.worker]++
		case "503 indeterminate":
			lost++
			r, err := apiCheck(h, a.worker, a.id, 1)
			if err != nil || r.code != 200 {
				t.Errorf("retry of lost check %s = %+v, %v; want 200", a.id, r, err)
				continue
			}
			allowedBy[a.worker]++
			replays++
		}
	}
	var spent, want int64
	for w := range h.e.workers {
		r, err := apiCheck(h, w, "", 0)
		if err != nil || r.code != 200 {
			t.Fatalf("peek of worker %d = %+v, %v", w, r, err)
		}
		spent += 1_000_000 - r.remain
		want += allowedBy[w]
		if 1_000_000-r.remain != allowedBy[w] {
			t.Errorf("worker %d: spent %d for %d checks allowed (lost ones retried), want equal", w, 1_000_000-r.remain, allowedBy[w])
		}
	}
	return fmt.Sprintf("%d lost replies retried (%d allowed), spent %d for %d allowed", lost, replays, spent, want)
}

// proxyEdge: the proxy, in front of an upstream, its workers on a
// fail-closed route and a fail-open one, two each.
func proxyEdge() hangEdge {
	paths := []string{"/closed", "/open", "/closed", "/open"}
	return hangEdge{
		name:    "proxy",
		workers: len(paths),
		config: func(upstream string) string {
			return fmt.Sprintf(`policies:
  - { id: closed, algorithm: fixed_window, limit: 1000000, window: 1h }
  - { id: open, algorithm: fixed_window, limit: 1000000, window: 1h, failure_mode: open }
proxy:
  listen: "127.0.0.1:0"
  upstream: "http://%s"
  routes:
    - { match: { path_prefix: /closed }, policies: [closed] }
    - { match: { path_prefix: /open }, policies: [open] }
`, upstream)
		},
		send: func(h *hangRun, w int, _ int64) (hangAnswer, error) {
			if h.proxy == "" {
				return hangAnswer{}, fmt.Errorf("no proxy listening line")
			}
			a := hangAnswer{worker: w, id: paths[w], start: time.Now()}
			resp, err := h.client.Post(h.proxy+paths[w], "text/plain", strings.NewReader("x"))
			a.took = time.Since(a.start)
			if err != nil {
				return a, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			a.code, a.kind = resp.StatusCode, fmt.Sprintf("%s %d", paths[w], resp.StatusCode)
			return a, nil
		},
		want: func(a hangAnswer) string {
			switch a.kind {
			case "/closed 202", "/closed 503", "/open 202":
				return ""
			}
			if a.id == "/closed" {
				return "want 202 forwarded or 503 failed closed"
			}
			return "want 202 forwarded: the route fails open"
		},
		// A 202 on the open route is also what failing open gives: only
		// the closed route's answers tell that Redis decided.
		decided: func(a hangAnswer) bool { return paths[a.worker] == "/open" || a.code == 202 },
		after: func(t *testing.T, h *hangRun) string {
			closed503 := 0
			for _, a := range h.snapshot() {
				if a.kind == "/closed 503" {
					closed503++
				}
			}
			if closed503 == 0 {
				t.Errorf("no 503 on the fail-closed route during the hang")
			}
			return fmt.Sprintf("%d × 503 on the fail-closed route", closed503)
		},
	}
}

// goroutines counts the goroutines of the process but os/signal's loop,
// which the first signal.Notify (serve's, for SIGHUP) starts for good.
func goroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			stacks := string(buf[:n])
			return strings.Count(stacks, "\n\ngoroutine ") + 1 - strings.Count(stacks, "os/signal.loop(")
		}
		buf = make([]byte, 2*len(buf))
	}
}
