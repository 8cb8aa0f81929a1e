package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// seen is one request as the upstream received it.
type seen struct {
	Method, URI, Host string
	Header            http.Header
	Body              string
}

// upstream is a real HTTP server that records what reaches it and
// answers 201 with a body and headers of its own.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []seen
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, seen{r.Method, r.RequestURI, r.Host, r.Header.Clone(), string(body)})
		u.mu.Unlock()
		w.Header().Set("X-Upstream", "yes")
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "upstream body for "+r.URL.Path)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

// proxyFixture is the proxy on a real socket over memstore on a fake
// clock, with metrics on their own registry.
type proxyFixture struct {
	url     string
	srv     *httptest.Server // Close waits for every handler in flight
	clock   *sluicetest.Clock
	logs    *syncBuffer
	metrics *server.Metrics
}

var proxyPolicies = []sluice.Policy{
	{ID: "three", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
	{ID: "shadowed", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
	{ID: "keyed", Algorithm: sluice.FixedWindow, Limit: 2, Window: 10 * time.Second},
}

// newProxyFixture serves cfg over policies on store (nil: a memstore);
// modes, when given, are the policies' failure modes.
func newProxyFixture(t *testing.T, cfg *config.Proxy, store sluice.Store, policies []sluice.Policy, modes ...map[string]failure.Mode) *proxyFixture {
	t.Helper()
	clock := sluicetest.NewClock()
	newMemstore := func() *memstore.Store {
		ms, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		return ms
	}
	if store == nil {
		store = newMemstore()
	}
	f := &proxyFixture{clock: clock, logs: &syncBuffer{}}
	ids := make([]string, len(policies))
	for i, p := range policies {
		ids[i] = p.ID
	}
	var err error
	if f.metrics, err = server.NewMetrics(prometheus.NewRegistry(), ids); err != nil {
		t.Fatal(err)
	}
	lim, err := sluice.New(f.metrics.InstrumentStore(store, "memory", clock), policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LocalShare == 0 {
		cfg.LocalShare = config.DefaultLocalShare
	}
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	popts := server.ProxyOptions{Pseudonymizer: subject.Unkeyed(), Logger: log, Metrics: f.metrics, Fallback: newMemstore()}
	if len(modes) > 0 {
		popts.FailureModes = modes[0]
	}
	p, err := server.NewProxy(cfg, lim, popts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ts := httptest.NewServer(p)
	t.Cleanup(ts.Close)
	f.url, f.srv = ts.URL, ts
	return f
}

type proxied struct {
	*http.Response
	body string
}

// send sends a request through the proxy; header is "Name: value" pairs.
func (f *proxyFixture) send(t *testing.T, method, path, body string, header ...string) proxied {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range header {
		k, v, _ := strings.Cut(kv, ": ")
		req.Header.Add(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return proxied{resp, string(b)}
}

// TestProxyForwardsThenLimits is 3 per 10s on a route: three requests
// reach the upstream as sent and come back as answered, the fourth is a
// 429 from sluice that the upstream never sees.
func TestProxyForwardsThenLimits(t *testing.T) {
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/api", Methods: []string{"POST"}}, Policies: []string{"three"}, Subject: "ip"},
	}}, nil, proxyPolicies)

	for i := range 3 {
		resp := f.send(t, "POST", "/api/orders?x=1&y=%2F", fmt.Sprintf(`{"n":%d}`, i),
			"Content-Type: application/json", "X-Custom: c1", "X-Custom: c2", "Authorization: Bearer t0ken",
			"Connection: X-Hop", "X-Hop: drop me")
		if resp.StatusCode != http.StatusCreated || resp.body != "upstream body for /api/orders" {
			t.Fatalf("request %d: %d %q, want the upstream's 201 and body", i+1, resp.StatusCode, resp.body)
		}
		if got := resp.Header.Values("Set-Cookie"); len(got) != 2 || resp.Header.Get("X-Upstream") != "yes" {
			t.Errorf("request %d: upstream headers lost: Set-Cookie %q, X-Upstream %q", i+1, got, resp.Header.Get("X-Upstream"))
		}
		want := []sfItem{{Value: "three", Params: []sfParam{{Key: "r", Value: int64(2 - i)}, {Key: "t", Value: int64(10)}}}}
		if got := mustParseList(t, resp.Header, "RateLimit"); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("request %d: RateLimit = %v, want %v", i+1, got, want)
		}
	}
	resp := f.send(t, "POST", "/api/orders", `{"n":3}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "10" {
		t.Fatalf("request 4: %d Retry-After %q, want 429 with Retry-After 10", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	var problem struct {
		Type             string   `json:"type"`
		Status           int      `json:"status"`
		ViolatedPolicies []string `json:"violated-policies"`
	}
	if err := json.Unmarshal([]byte(resp.body), &problem); err != nil || resp.Header.Get("Content-Type") != "application/problem+json" ||
		problem.Status != 429 || len(problem.ViolatedPolicies) != 1 || problem.ViolatedPolicies[0] != "three" {
		t.Errorf("request 4: %s %q (%v), want a problem naming policy three", resp.Header.Get("Content-Type"), resp.body, err)
	}
	if resp.Header.Get("X-Upstream") != "" {
		t.Errorf("request 4 carries the upstream's headers: it must be sluice's own answer")
	}

	reqs := up.requests()
	if len(reqs) != 3 {
		t.Fatalf("upstream saw %d requests, want 3", len(reqs))
	}
	host := strings.TrimPrefix(f.url, "http://")
	for i, r := range reqs {
		if r.Method != "POST" || r.URI != "/api/orders?x=1&y=%2F" || r.Host != host || r.Body != fmt.Sprintf(`{"n":%d}`, i) {
			t.Errorf("upstream request %d = %s %s Host %s body %q, want the client's", i+1, r.Method, r.URI, r.Host, r.Body)
		}
		for name, want := range map[string]string{
			"Content-Type": "application/json", "Authorization": "Bearer t0ken",
			"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": host, "X-Forwarded-Proto": "http",
		} {
			if got := r.Header.Get(name); got != want {
				t.Errorf("upstream request %d: %s = %q, want %q", i+1, name, got, want)
			}
		}
		if got := r.Header.Values("X-Custom"); len(got) != 2 || got[0] != "c1" || got[1] != "c2" {
			t.Errorf("upstream request %d: X-Custom = %q, want both lines", i+1, got)
		}
		if got := r.Header.Get("X-Hop"); got != "" {
			t.Errorf("upstream request %d: hop-by-hop X-Hop reached the upstream: %q", i+1, got)
		}
	}
}

// TestProxySpoofedForwardedFor checks that X-Forwarded-For from a peer
// that is not a trusted proxy neither changes the subject nor reaches the
// upstream; from a trusted one, the right-most untrusted hop is the
// subject and the chain is kept.
func TestProxySpoofedForwardedFor(t *testing.T) {
	up := newUpstream(t)
	routes := []config.Route{{Match: config.Match{PathPrefix: "/"}, Policies: []string{"three"}, Subject: "ip"}}
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, TrustedProxies: []string{"10.0.0.0/8"}, Routes: routes}, nil, proxyPolicies)
	for i, want := range []int{201, 201, 201, 429, 429} {
		resp := f.send(t, "GET", "/", "", fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", i+1), "Forwarded: for=192.0.2.9", "X-Real-IP: 192.0.2.10", "True-Client-IP: 192.0.2.11")
		if resp.StatusCode != want {
			t.Fatalf("request %d with a fresh spoofed X-Forwarded-For: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	for _, r := range up.requests() {
		if got := r.Header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
			t.Errorf("upstream X-Forwarded-For = %q, want only the peer 127.0.0.1", got)
		}
		if got := r.Header.Get("Forwarded"); got != "" {
			t.Errorf("upstream Forwarded = %q from an untrusted peer, want none", got)
		}
		for _, name := range []string{"X-Real-Ip", "True-Client-Ip"} {
			if got := r.Header.Get(name); got != "" {
				t.Errorf("upstream %s = %q from an untrusted peer, want none", name, got)
			}
		}
	}

	up = newUpstream(t)
	f = newProxyFixture(t, &config.Proxy{Upstream: up.URL, TrustedProxies: []string{"127.0.0.0/8"}, Routes: routes}, nil, proxyPolicies)
	for i := range 3 {
		if resp := f.send(t, "GET", "/", "", "X-Forwarded-For: 203.0.113.7", "X-Forwarded-Proto: https"); resp.StatusCode != 201 {
			t.Fatalf("request %d from 203.0.113.7 via a trusted proxy: %d, want 201", i+1, resp.StatusCode)
		}
	}
	if resp := f.send(t, "GET", "/", "", "X-Forwarded-For: 203.0.113.7"); resp.StatusCode != 429 {
		t.Errorf("fourth request from 203.0.113.7: %d, want 429", resp.StatusCode)
	}
	if resp := f.send(t, "GET", "/", "", "X-Forwarded-For: 203.0.113.8"); resp.StatusCode != 201 {
		t.Errorf("first request from 203.0.113.8: %d, want 201 (a budget of its own)", resp.StatusCode)
	}
	r := up.requests()[0]
	if got := r.Header.Get("X-Forwarded-For"); got != "203.0.113.7, 127.0.0.1" {
		t.Errorf("upstream X-Forwarded-For = %q, want the chain with the peer appended", got)
	}
	if got := r.Header.Get("X-Forwarded-Proto"); got != "https" {
		t.Errorf("upstream X-Forwarded-Proto = %q, want the trusted proxy's https", got)
	}
}

func TestProxyShadowAndUnmatched(t *testing.T) {
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/shadow"}, Policies: []string{"shadowed"}, Subject: "ip", Shadow: true},
		{Match: config.Match{PathPrefix: "/api"}, Policies: []string{"three"}, Subject: "ip"},
	}}, nil, proxyPolicies)
	for i := range 5 {
		resp := f.send(t, "GET", "/shadow/x", "")
		if resp.StatusCode != 201 || resp.Header.Get("RateLimit-Policy") == "" {
			t.Fatalf("shadow request %d: %d RateLimit-Policy %q, want the upstream's 201 with the headers", i+1, resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
		}
	}
	for i := range 10 {
		resp := f.send(t, "GET", "/apikeys", "")
		if resp.StatusCode != 201 || resp.Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("unmatched request %d: %d RateLimit-Policy %q, want 201 unlimited without headers", i+1, resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
		}
	}
	if n := len(up.requests()); n != 15 {
		t.Errorf("upstream saw %d requests, want 15", n)
	}
	if !strings.Contains(f.logs.String(), "shadow: not enforced") {
		t.Errorf("the log does not report the would-be denials:\n%s", f.logs.String())
	}
	got := scrape(t, f.metrics)
	for series, want := range map[string]float64{
		`sluice_proxy_decisions_total{action="admitted",route="* /shadow",shadow="false"}`: 3,
		`sluice_proxy_decisions_total{action="limited",route="* /shadow",shadow="true"}`:   2,
		`sluice_decisions_total{outcome="denied",policy="shadowed"}`:                       2,
		`sluice_http_requests_total{code="201",handler="proxy"}`:                           15,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}

func TestProxyUpstreamDown(t *testing.T) {
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/"}, Policies: []string{"three"}, Subject: "ip"},
	}}, nil, proxyPolicies)
	up.Close()
	resp := f.send(t, "GET", "/x", "")
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(resp.body, `"status":502`) {
		t.Fatalf("upstream down: %d %s %q, want a 502 problem", resp.StatusCode, resp.Header.Get("Content-Type"), resp.body)
	}
	if resp.Header.Get("RateLimit") == "" {
		t.Errorf("the 502 of an admitted request lacks its RateLimit field")
	}
	if logs := f.logs.String(); !strings.Contains(logs, "proxy: upstream failed") || strings.Contains(logs, "panic") {
		t.Errorf("the log does not report the upstream failure cleanly:\n%s", logs)
	}
	if got := scrape(t, f.metrics)[`sluice_http_requests_total{code="502",handler="proxy"}`]; got != 1 {
		t.Errorf("502s counted: %v, want 1", got)
	}
}

// TestProxyFailureModes runs the proxy over a store that cannot decide.
func TestProxyFailureModes(t *testing.T) {
	policies := []sluice.Policy{
		{ID: "closed", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
		{ID: "open", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
		{ID: "local", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
	}
	modes := map[string]failure.Mode{"open": failure.Open, "local": failure.Local}
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, LocalShare: 0.2, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/closed"}, Policies: []string{"closed"}, Subject: "ip"},
		{Match: config.Match{PathPrefix: "/open"}, Policies: []string{"open"}, Subject: "ip"},
		{Match: config.Match{PathPrefix: "/local"}, Policies: []string{"local"}, Subject: "ip"},
	}}, failingStore{fmt.Errorf("test: dial: %w", sluice.FailedBeforeSend)}, policies, modes)
	if resp := f.send(t, "GET", "/closed", ""); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("fail closed: %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for i := range 3 {
		if resp := f.send(t, "GET", "/open", ""); resp.StatusCode != 201 {
			t.Errorf("fail open request %d: %d, want 201", i+1, resp.StatusCode)
		}
	}
	// 0.2 of 10: the local fallback admits 2.
	for i, want := range []int{201, 201, 429} {
		if resp := f.send(t, "GET", "/local", ""); resp.StatusCode != want {
			t.Errorf("fail local request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	got := scrape(t, f.metrics)
	for series, want := range map[string]float64{
		`sluice_decisions_total{outcome="unavailable",policy="closed"}`:                     1,
		`sluice_decisions_total{outcome="unavailable",policy="open"}`:                       3,
		`sluice_decisions_total{outcome="unavailable",policy="local"}`:                      3,
		`sluice_proxy_decisions_total{action="failed_open",route="* /open",shadow="false"}`: 3,
		`sluice_proxy_local_decisions_total{outcome="allowed",route="* /local"}`:            2,
		`sluice_proxy_local_decisions_total{outcome="denied",route="* /local"}`:             1,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}

func TestProxyHeaderSubject(t *testing.T) {
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/"}, Policies: []string{"keyed"}, Subject: "header:X-Api-Key"},
	}}, nil, proxyPolicies)
	for i, want := range []int{201, 201, 429} {
		if resp := f.send(t, "GET", "/", "", "X-Api-Key: key-a"); resp.StatusCode != want {
			t.Fatalf("key-a request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	if resp := f.send(t, "GET", "/", "", "X-Api-Key: key-b"); resp.StatusCode != 201 {
		t.Errorf("key-b: %d, want 201 (a budget of its own)", resp.StatusCode)
	}
	// Without the header, the address is the subject: limited, not free.
	for i, want := range []int{201, 201, 429} {
		if resp := f.send(t, "GET", "/", ""); resp.StatusCode != want {
			t.Errorf("request %d without a key: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	// Sent twice, the header names no one subject, and the upstream
	// would read either line: refused before the limiter.
	before := len(up.requests())
	if resp := f.send(t, "GET", "/", "", "X-Api-Key: key-c", "X-Api-Key: key-d"); resp.StatusCode != 400 {
		t.Errorf("two X-Api-Key lines: %d, want 400", resp.StatusCode)
	}
	if n := len(up.requests()); n != before {
		t.Errorf("two X-Api-Key lines reached the upstream (%d requests, want %d)", n, before)
	}
	// A list on one line is the same two values (RFC 9110, 5.3): key-a's
	// spent budget must not come back under "NEW3, key-a", which an
	// upstream that reads the first or the last value takes as a key.
	for _, list := range []string{"NEW3, key-a", "key-a,NEW4", "key-a ,"} {
		if resp := f.send(t, "GET", "/", "", "X-Api-Key: "+list); resp.StatusCode != 400 {
			t.Errorf("X-Api-Key: %s: %d, want 400", list, resp.StatusCode)
		}
	}
	if n := len(up.requests()); n != before {
		t.Errorf("a listed X-Api-Key reached the upstream (%d requests, want %d)", n, before)
	}
	if got := up.requests()[0].Header.Get("X-Api-Key"); got != "key-a" {
		t.Errorf("upstream X-Api-Key = %q, want the client's key passed on", got)
	}
}

// TestProxyReusesUpstreamConnections: 32 clients sending at once through
// the proxy reach the upstream over about as many connections, reused
// from one round of requests to the next, instead of a new connection for
// nearly every request (http.DefaultTransport keeps 2 idle per host). The
// upstream holds each round's requests until all 32 have arrived, so each
// round has 32 on the wire at once, whatever the machine's load: the
// first dials 32 connections, the next ones find them idle (unsynchronized
// clients, on a loaded machine, made the transport dial for requests that
// an idle connection would have served a moment later).
func TestProxyReusesUpstreamConnections(t *testing.T) {
	const clients, rounds = 32, 5
	var dialled atomic.Int64
	var gates [rounds]struct {
		arrived atomic.Int64
		all     chan struct{}
	}
	for i := range gates {
		gates[i].all = make(chan struct{})
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := &gates[len(r.Header.Get("X-Round"))-1] // "x" for round 0, "xx" for round 1, ...
		if g.arrived.Add(1) == clients {
			close(g.all)
		}
		select {
		case <-g.all:
		case <-time.After(10 * time.Second): // a request lost on the way fails below
		}
		io.WriteString(w, "ok")
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/"}, Policies: []string{"open"}, Subject: "header:X-Api-Key"},
	}}, nil, []sluice.Policy{{ID: "open", Algorithm: sluice.GCRA, Limit: 1_000_000, Window: time.Second}})
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for round := range rounds {
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", f.url+"/", nil)
				req.Header.Set("X-Api-Key", fmt.Sprint("client-", c))
				req.Header.Set("X-Round", strings.Repeat("x", round+1))
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("status %d, want 200", resp.StatusCode)
				}
			})
		}
		wg.Wait()
	}
	t.Logf("the upstream accepted %d connections for %d rounds of %d requests at once", dialled.Load(), rounds, clients)
	if n := dialled.Load(); n > 2*clients {
		t.Errorf("the upstream accepted %d connections for %d rounds of %d requests at once, want at most %d: the proxy dials anew instead of reusing", n, rounds, clients, 2*clients)
	}
}

func TestNewProxyRejects(t *testing.T) {
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	lim, err := sluice.New(ms, proxyPolicies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := server.ProxyOptions{Pseudonymizer: subject.Unkeyed(), Logger: slog.New(slog.DiscardHandler)}
	route := config.Route{Match: config.Match{PathPrefix: "/"}, Policies: []string{"three"}, Subject: "ip"}
	localOpts := opts
	localOpts.FailureModes = map[string]failure.Mode{"three": failure.Local}
	local, err := sluice.New(ms, []sluice.Policy{{ID: "three", Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cfg  *config.Proxy
		lim  *sluice.Limiter
		opts server.ProxyOptions
	}{
		"no config":       {nil, lim, opts},
		"no limiter":      {&config.Proxy{Upstream: "http://127.0.0.1:9", Routes: []config.Route{route}}, nil, opts},
		"no logger":       {&config.Proxy{Upstream: "http://127.0.0.1:9", Routes: []config.Route{route}}, lim, server.ProxyOptions{Pseudonymizer: subject.Unkeyed()}},
		"bad upstream":    {&config.Proxy{Upstream: "127.0.0.1:9", Routes: []config.Route{route}}, lim, opts},
		"bad subject":     {&config.Proxy{Upstream: "http://127.0.0.1:9", Routes: []config.Route{{Match: route.Match, Policies: route.Policies, Subject: "cookie"}}}, lim, opts},
		"unknown policy":  {&config.Proxy{Upstream: "http://127.0.0.1:9", Routes: []config.Route{{Match: route.Match, Policies: []string{"nope"}, Subject: "ip"}}}, lim, opts},
		"bad trusted net": {&config.Proxy{Upstream: "http://127.0.0.1:9", TrustedProxies: []string{"nope"}, Routes: []config.Route{route}}, lim, opts},
		"no fallback":     {&config.Proxy{Upstream: "http://127.0.0.1:9", LocalShare: 0.5, Routes: []config.Route{route}}, local, localOpts},
	} {
		if p, err := server.NewProxy(tc.cfg, tc.lim, tc.opts); err == nil {
			p.Close()
			t.Errorf("NewProxy(%s) succeeded, want an error", name)
		}
	}
	// With a store for its fallback, the "no fallback" proxy is fine.
	withFallback := localOpts
	withFallback.Fallback = ms
	p, err := server.NewProxy(&config.Proxy{Upstream: "http://127.0.0.1:9", LocalShare: 0.5, Routes: []config.Route{route}}, local, withFallback)
	if err != nil {
		t.Fatalf("NewProxy with a local policy and a fallback store: %v", err)
	}
	p.Close()
}

// scrape gathers m through the text exposition format, as Prometheus
// would, and returns every sample by its series name with sorted labels.
func scrape(t *testing.T, m *server.Metrics) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return parseExposition(t, rec.Body.String())
}

// parseExposition parses the Prometheus text format strictly.
func parseExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("the metrics do not parse: %v\n%s", err, text)
	}
	out := map[string]float64{}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := name
			if len(labels) > 0 {
				series += "{" + strings.Join(labels, ",") + "}"
			}
			switch fam.GetType() {
			case dto.MetricType_COUNTER:
				out[series] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[series] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[series+"_count"] = float64(m.GetHistogram().GetSampleCount())
				for _, b := range m.GetHistogram().GetBucket() {
					le := append([]string{fmt.Sprintf("le=%q", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))}, labels...)
					out[name+"_bucket{"+strings.Join(le, ",")+"}"] = float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out
}

// TestProxyRouteSpellings: a POST /login route limits every spelling of
// that path and method a lenient upstream server takes for it; the budget
// spent by one spelling is the budget of all.
func TestProxyRouteSpellings(t *testing.T) {
	up := newUpstream(t)
	routes := []config.Route{{Match: config.Match{PathPrefix: "/login", Methods: []string{"POST"}}, Policies: []string{"three"}, Subject: "ip"}}
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: routes}, nil, proxyPolicies)
	for i, sp := range []struct{ method, path string }{
		{"POST", "/login"}, {"post", "/LOGIN"}, {"POST", "/login;jsessionid=1"},
		{"POST", "/login..;/"}, {"Post", "/login."}, {"POST", "/login%20"}, {"POST", "/x/../Login/"},
	} {
		want := 201
		if i >= 3 {
			want = 429
		}
		if resp := f.send(t, sp.method, sp.path, ""); resp.StatusCode != want {
			t.Errorf("%s %s (request %d): %d, want %d: every spelling shares the route's budget of 3", sp.method, sp.path, i+1, resp.StatusCode, want)
		}
	}
	if resp := f.send(t, "POST", "/loginx", ""); resp.StatusCode != 201 {
		t.Errorf("POST /loginx: %d, want 201: another path, unlimited", resp.StatusCode)
	}
}
