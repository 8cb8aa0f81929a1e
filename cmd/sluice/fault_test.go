package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/faultproxy"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestServeRedisHangs: sluice serve's check API in front of a Redis that
// hangs (a proxy that accepts connections and never answers) for two
// seconds, under load, with the store's health (/readyz/store) polled
// throughout. It holds:
//
//   - every check is answered within server.decision_timeout (500ms by
//     default) plus 250ms, with 200 or 503 and the outcome the store
//     typed;
//   - /readyz/store says 503 while Redis hangs and 200 once it is back;
//   - checks are allowed again within 1s of Redis being back;
//   - a check whose reply was lost (indeterminate), retried with its
//     evaluation_id, is spent once: the budget spent equals the checks
//     allowed;
//   - no goroutine outlives the server.
//
// It logs its figures; RELIABILITY.md quotes them:
//
//	go test ./cmd/sluice -run TestServeRedisHangs -v -count=1
func TestServeRedisHangs(t *testing.T) {
	srv := redistest.Standalone(t)
	before := goroutines() // the Redis process's waiter included
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	const (
		timeout         = 500 * time.Millisecond // store.redis.timeout
		decisionTimeout = 500 * time.Millisecond // server.decision_timeout's default
		margin          = 250 * time.Millisecond
		workers         = 4
		limit           = 1_000_000
	)
	cfg := writeConfig(t, fmt.Sprintf(`
server: { listen: "127.0.0.1:0" }
store:
  type: redis
  redis: { url: "redis://%s/0", timeout: %v }
policies:
  - { id: api, algorithm: fixed_window, limit: %d, window: 1h, dedupe_ttl: 1h, dedupe_max: 10000 }
`, p.Addr(), timeout, limit))
	s := startServe(t, "-c", cfg)
	tr := &http.Transport{MaxIdleConnsPerHost: workers + 1}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	type answer struct {
		worker  int
		id      string
		start   time.Time
		took    time.Duration
		code    int
		outcome string
	}
	check := func(w int, id string, cost int) (answer, error) {
		body := fmt.Sprintf(`{"policy":"api","subject":"worker-%d","evaluation_id":%q,"cost":%d}`, w, id, cost)
		if id == "" {
			body = fmt.Sprintf(`{"policy":"api","subject":"worker-%d","cost":%d}`, w, cost)
		}
		a := answer{worker: w, id: id, start: time.Now()}
		resp, err := client.Post(s.url+"/v1/check", "application/json", strings.NewReader(body))
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
		a.code, a.outcome = resp.StatusCode, out.Outcome
		if cost == 0 {
			a.outcome = fmt.Sprint(out.Remaining)
		}
		return a, nil
	}
	type probe struct {
		start time.Time
		took  time.Duration
		code  int
	}
	var (
		mu      sync.Mutex
		answers []answer
		readyz  []probe
		wg      sync.WaitGroup
		stop    = make(chan struct{})
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				a, err := check(w, fmt.Sprintf("w%d-%d", w, i), 1)
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			start := time.Now()
			resp, err := client.Get(s.url + "/readyz/store")
			if err != nil {
				t.Errorf("GET /readyz/store: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			readyz = append(readyz, probe{start, time.Since(start), resp.StatusCode})
			mu.Unlock()
		}
	})
	// allowedSince reports whether every worker has had n checks allowed
	// in a row since from.
	allowedSince := func(from time.Time, n int) bool {
		mu.Lock()
		defer mu.Unlock()
		streak := make([]int, workers)
		for _, a := range answers {
			switch {
			case a.start.Before(from):
			case a.code == 200:
				streak[a.worker]++
			default:
				streak[a.worker] = 0
			}
		}
		return slices.Min(streak) >= n
	}
	readySince := func(from time.Time) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(readyz, func(r probe) bool { return r.start.After(from) && r.code == 200 })
	}
	waitAllowed := func(from time.Time) {
		t.Helper()
		for range 750 { // 15s at most
			if allowedSince(from, 20) && readySince(from) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("not every worker had 20 checks allowed and /readyz/store 200 within 15s of %v", from)
	}
	waitAllowed(time.Time{})
	hung := time.Now()
	p.Hang()
	p.Drop()
	time.Sleep(2 * time.Second)
	p.Drop()
	p.Forward()
	back := time.Now()
	waitAllowed(back)
	close(stop)
	wg.Wait()

	sort.Slice(answers, func(i, j int) bool { return answers[i].start.Before(answers[j].start) })
	kinds := map[string]int{}
	var maxTook time.Duration
	recovered := back
	allowedBy := make([]int64, workers)
	var lost []answer
	for _, a := range answers {
		k := fmt.Sprintf("%d %s", a.code, a.outcome)
		kinds[k]++
		maxTook = max(maxTook, a.took)
		if a.took > decisionTimeout+margin {
			t.Errorf("check %s took %v, want at most %v + %v", a.id, a.took, decisionTimeout, margin)
		}
		switch k {
		case "200 allowed":
			allowedBy[a.worker]++
		case "503 indeterminate":
			lost = append(lost, a)
		case "503 unavailable":
		default:
			t.Errorf("check %s = %s, want 200 allowed, 503 unavailable or 503 indeterminate", a.id, k)
		}
		if a.code != 200 && !a.start.Before(recovered) {
			recovered = a.start.Add(a.took)
		}
	}
	if r := recovered.Sub(back); r > time.Second {
		t.Errorf("checks failed until %v after Redis was back, want at most 1s", r)
	}
	// /readyz/store: 503 from the first check the hang failed until Redis is
	// back, 200 before and after; a probe that straddles a change may say
	// either. (Timed from the hang, timeout + margin, a loaded machine
	// probed before any round trip had timed out: the store knew nothing
	// yet.)
	firstFailed := back
	for _, a := range answers {
		if a.code != 200 && a.start.After(hung) && a.start.Add(a.took).Before(firstFailed) {
			firstFailed = a.start.Add(a.took)
		}
	}
	var readyHung []time.Duration
	readyBack := time.Duration(-1)
	for _, r := range readyz {
		switch {
		case r.start.After(firstFailed) && r.start.Add(r.took).Before(back):
			readyHung = append(readyHung, r.took)
			if r.code != 503 {
				t.Errorf("GET /readyz/store %v into the hang = %d, want 503", r.start.Sub(hung), r.code)
			}
		case r.start.After(back) && r.code == 200 && readyBack < 0:
			readyBack = r.start.Add(r.took).Sub(back)
		}
	}
	if readyBack < 0 || readyBack > time.Second+200*time.Millisecond {
		t.Errorf("GET /readyz/store said 200 again %v after Redis was back, want within 1s (probed every 100ms)", readyBack)
	}
	// Nothing spent twice: the lost checks again, with their ids.
	replays := 0
	for _, a := range lost {
		r, err := check(a.worker, a.id, 1)
		if err != nil || r.code != 200 {
			t.Errorf("retry of lost check %s = %+v, %v; want 200", a.id, r, err)
			continue
		}
		allowedBy[a.worker]++
		replays++
	}
	var spent, want int64
	for w := range workers {
		r, err := check(w, "", 0)
		if err != nil || r.code != 200 {
			t.Fatalf("peek of worker %d = %+v, %v", w, r, err)
		}
		var remaining int64
		fmt.Sscan(r.outcome, &remaining)
		spent += limit - remaining
		want += allowedBy[w]
		if limit-remaining != allowedBy[w] {
			t.Errorf("worker %d: spent %d for %d checks allowed (lost ones retried), want equal", w, limit-remaining, allowedBy[w])
		}
	}
	var kindList []string
	for k, n := range kinds {
		kindList = append(kindList, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kindList)
	t.Logf("Redis hung 2s behind sluice serve: %d checks, max latency %v (bound %v + %v); %s; recovered %v after Redis was back; /readyz/store while hung: %d probes, max %v; 200 again %v after; %d lost replies retried (%d allowed), spent %d for %d allowed",
		len(answers), maxTook.Round(time.Millisecond), decisionTimeout, margin, strings.Join(kindList, ", "),
		recovered.Sub(back).Round(time.Millisecond), len(readyHung), slices.Max(append(readyHung, 0)).Round(time.Millisecond),
		readyBack.Round(time.Millisecond), len(lost), replays, spent, want)

	if err := s.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	p.Close()
	tr.CloseIdleConnections()
	for range 100 {
		if goroutines() <= before {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Errorf("goroutines: %d before, %d after serve stopped:\n%s", before, goroutines(), buf[:runtime.Stack(buf, true)])
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

// TestServeProxyRedisHangs: sluice serve's proxy in front of an upstream,
// its Redis hung for two seconds (the fault proxy accepts and never
// answers). A fail-closed route answers 503 and a fail-open route forwards,
// each within proxy.decision_timeout (500ms by default) plus 250ms; once
// Redis is back both are decided by it again within 1s. It logs the
// figures RELIABILITY.md quotes:
//
//	go test ./cmd/sluice -run TestServeProxyRedisHangs -v -count=1
func TestServeProxyRedisHangs(t *testing.T) {
	srv := redistest.Standalone(t)
	before := goroutines()
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var upMu sync.Mutex
	upstreamSaw := map[string]int{}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upMu.Lock()
		upstreamSaw[r.URL.Path]++
		upMu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	})}
	upL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(upL)
	const (
		decisionTimeout = 500 * time.Millisecond // proxy.decision_timeout's default
		margin          = 250 * time.Millisecond
	)
	cfg := writeConfig(t, fmt.Sprintf(`
server: { listen: "127.0.0.1:0" }
store:
  type: redis
  redis: { url: "redis://%s/0", timeout: 500ms }
policies:
  - { id: closed, algorithm: fixed_window, limit: 1000000, window: 1h }
  - { id: open, algorithm: fixed_window, limit: 1000000, window: 1h, failure_mode: open }
proxy:
  listen: "127.0.0.1:0"
  upstream: "http://%s"
  routes:
    - { match: { path_prefix: /closed }, policies: [closed] }
    - { match: { path_prefix: /open }, policies: [open] }
`, p.Addr(), upL.Addr()))
	s := startServe(t, "-c", cfg)
	m := proxyLine.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", s.logs)
	}
	proxyURL := m[1]
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	type answer struct {
		path  string
		start time.Time
		took  time.Duration
		code  int
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
		stop    = make(chan struct{})
	)
	for _, path := range []string{"/closed", "/open", "/closed", "/open"} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				a := answer{path: path, start: time.Now()}
				resp, err := client.Post(proxyURL+path, "text/plain", strings.NewReader("x"))
				a.took = time.Since(a.start)
				if err != nil {
					t.Errorf("POST %s: %v", path, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				a.code = resp.StatusCode
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		})
	}
	// decided reports whether each route has had n answers decided by
	// Redis in a row since from (202 forwarded for closed; for open a 202
	// is also what failing open gives, so its streak counts only once the
	// closed route's did).
	decided := func(from time.Time, n int) bool {
		mu.Lock()
		defer mu.Unlock()
		streak := 0
		for _, a := range answers {
			switch {
			case a.start.Before(from) || a.path != "/closed":
			case a.code == 202:
				streak++
			default:
				streak = 0
			}
		}
		return streak >= n
	}
	wait := func(from time.Time) {
		for range 750 { // 15s at most
			if decided(from, 20) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait(time.Time{})
	hung := time.Now()
	p.Hang()
	p.Drop()
	time.Sleep(2 * time.Second)
	p.Drop()
	p.Forward()
	back := time.Now()
	wait(back)
	close(stop)
	wg.Wait()

	sort.Slice(answers, func(i, j int) bool { return answers[i].start.Before(answers[j].start) })
	codes := map[string]int{}
	maxTook := map[string]time.Duration{}
	recovered := back
	for _, a := range answers {
		codes[fmt.Sprintf("%s %d", a.path, a.code)]++
		maxTook[a.path] = max(maxTook[a.path], a.took)
		if a.took > decisionTimeout+margin {
			t.Errorf("POST %s at %v took %v, want at most %v + %v", a.path, a.start.Sub(hung), a.took, decisionTimeout, margin)
		}
		switch {
		case a.path == "/closed" && a.code != 202 && a.code != 503,
			a.path == "/open" && a.code != 202:
			t.Errorf("POST %s = %d, want 202 forwarded%s", a.path, a.code, map[bool]string{true: " or 503 failed closed"}[a.path == "/closed"])
		}
		if a.path == "/closed" && a.code != 202 && !a.start.Before(recovered) {
			recovered = a.start.Add(a.took)
		}
	}
	if codes["/closed 503"] == 0 {
		t.Errorf("no 503 on the fail-closed route during a 2s hang: %v", codes)
	}
	if r := recovered.Sub(back); r > time.Second {
		t.Errorf("the fail-closed route answered 503 until %v after Redis was back, want at most 1s", r)
	}
	var list []string
	for k, n := range codes {
		list = append(list, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(list)
	upMu.Lock()
	t.Logf("Redis hung 2s behind the proxy: %s; max latency closed %v, open %v (bound %v + %v); closed route decided again %v after Redis was back; upstream received %v",
		strings.Join(list, ", "), maxTook["/closed"].Round(time.Millisecond), maxTook["/open"].Round(time.Millisecond), decisionTimeout, margin,
		recovered.Sub(back).Round(time.Millisecond), upstreamSaw)
	upMu.Unlock()

	if err := s.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	p.Close()
	up.Close()
	tr.CloseIdleConnections()
	for range 100 {
		if goroutines() <= before {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Errorf("goroutines: %d before, %d after serve stopped:\n%s", before, goroutines(), buf[:runtime.Stack(buf, true)])
}
