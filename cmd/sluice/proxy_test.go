package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var proxyLine = regexp.MustCompile(`msg="proxy listening" addr=(http://\S+)`)

// TestServeProxy runs sluice serve with a proxy: section in front of a
// real upstream, then checks the metrics and that no raw identity (the
// subject, the API key, the client address) is in /metrics or the logs.
func TestServeProxy(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "from upstream")
	}))
	defer up.Close()

	const (
		rawIP      = "203.0.113.77"
		rawKey     = "sk_live_5ecretKey"
		rawSubject = "alice@example.com"
	)
	cfg := `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: three, algorithm: fixed_window, limit: 3, window: 1h }
  - { id: keyed, algorithm: fixed_window, limit: 2, window: 1h }
proxy:
  listen: "127.0.0.1:0"
  upstream: "` + up.URL + `"
  trusted_proxies: ["127.0.0.1/32"]
  routes:
    - match: { path_prefix: /api, methods: [POST] }
      policies: [three]
      subject: ip
    - match: { path_prefix: /keyed }
      policies: [keyed]
      subject: "header:X-Api-Key"
`
	s := startServe(t, "-c", writeConfig(t, cfg), "--log-level", "debug")
	m := proxyLine.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", s.logs)
	}
	proxyURL := m[1]

	send := func(method, path, body string, header ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, proxyURL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range header {
			k, v, _ := strings.Cut(kv, ": ")
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for i, want := range []int{202, 202, 202, 429} {
		resp := send("POST", "/api/orders", "order", "X-Forwarded-For: "+rawIP)
		if resp.StatusCode != want {
			t.Fatalf("POST /api/orders #%d: %d, want %d", i+1, resp.StatusCode, want)
		}
		if want == 429 {
			if ra := resp.Header.Get("Retry-After"); ra != "3600" && ra != "3599" {
				t.Errorf("429 Retry-After = %q, want about 3600", ra)
			}
			if resp.Header.Get("X-Upstream") != "" {
				t.Errorf("the 429 came from the upstream")
			}
		}
	}
	mu.Lock()
	if len(bodies) != 3 || bodies[0] != "order" {
		t.Errorf("upstream saw %q, want 3 requests with the client's body", bodies)
	}
	mu.Unlock()
	if resp := send("GET", "/keyed", "", "X-Api-Key: "+rawKey); resp.StatusCode != 202 {
		t.Errorf("GET /keyed: %d, want 202", resp.StatusCode)
	}
	if resp := send("GET", "/elsewhere", ""); resp.StatusCode != 202 || resp.Header.Get("RateLimit") != "" {
		t.Errorf("GET /elsewhere: %d RateLimit %q, want 202 unlimited", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"three","subject":"`+rawSubject+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The API port does not proxy; the proxy port does not serve the API.
	if resp := send("POST", "/v1/check", `{"policy":"three","subject":"x"}`); resp.StatusCode != 202 {
		t.Errorf("POST /v1/check on the proxy port: %d, want the upstream's 202", resp.StatusCode)
	}

	resp, err = http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	metrics := string(raw)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(metrics))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, metrics)
	}
	counts := map[string]float64{}
	for _, m := range families["sluice_decisions_total"].GetMetric() {
		var policy, outcome string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "policy":
				policy = l.GetValue()
			case "outcome":
				outcome = l.GetValue()
			}
		}
		counts[policy+" "+outcome] = m.GetCounter().GetValue()
	}
	for k, want := range map[string]float64{"three allowed": 4, "three denied": 1, "keyed allowed": 1} {
		if counts[k] != want {
			t.Errorf("sluice_decisions_total{%s} = %v, want %v", k, counts[k], want)
		}
	}
	if h := families["sluice_decision_duration_seconds"]; h == nil || h.GetMetric()[0].GetHistogram().GetSampleCount() != 6 {
		t.Errorf("sluice_decision_duration_seconds: %v, want 6 store evaluations", h)
	}
	if families["go_goroutines"] == nil {
		t.Errorf("/metrics lacks the Go runtime collector")
	}
	if e := families["sluice_store_evictions_total"]; e == nil || e.GetMetric()[0].GetCounter().GetValue() != 0 {
		t.Errorf("sluice_store_evictions_total: %v, want the memory store's count, 0", e)
	}
	if e := families["sluice_store_evicted_ids_total"]; e == nil || e.GetMetric()[0].GetCounter().GetValue() != 0 {
		t.Errorf("sluice_store_evicted_ids_total: %v, want the memory store's count of ids, 0", e)
	}

	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
	logs := s.logs.String()
	if !strings.Contains(logs, "subject=") {
		t.Fatalf("the debug log holds no decisions to check:\n%s", logs)
	}
	for _, secret := range []string{rawIP, rawKey, rawSubject, "alice"} {
		if strings.Contains(metrics, secret) {
			t.Errorf("/metrics holds the raw %q:\n%s", secret, metrics)
		}
		if strings.Contains(logs, secret) {
			t.Errorf("the logs hold the raw %q:\n%s", secret, logs)
		}
	}
}

// TestServeProxySlowBody: a client that stops sending its request body
// mid-way loses its connection after proxy.read_timeout instead of holding
// it, and the upstream's, forever.
func TestServeProxySlowBody(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer up.Close()
	cfg := `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: three, algorithm: fixed_window, limit: 3, window: 1h }
proxy:
  listen: "127.0.0.1:0"
  upstream: "` + up.URL + `"
  read_timeout: 1s
  routes:
    - match: { path_prefix: / }
      policies: [three]
`
	s := startServe(t, "-c", writeConfig(t, cfg))
	m := proxyLine.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", s.logs)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(m[1], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nonly a few bytes")
	// Bounded: the server must end the exchange well within this.
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("the stalled request's connection was still open after 20s with read_timeout 1s: %v", err)
	}
}
