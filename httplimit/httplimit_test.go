package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/localquota"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/sfparse"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// harness is a real HTTP server on 127.0.0.1 behind the middleware, over a
// real Limiter.
type harness struct {
	t       *testing.T
	clock   *sluicetest.Clock
	limiter *sluice.Limiter
	srv     *httptest.Server
	logs    *syncBuffer

	mu        sync.Mutex
	decisions []httplimit.Decision
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newMemStore(t *testing.T, clock sluice.Clock) *memstore.Store {
	t.Helper()
	st, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatalf("memstore.New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// newHarness serves the middleware over a memstore on a fake clock.
func newHarness(t *testing.T, policies []sluice.Policy, opts httplimit.Options) *harness {
	t.Helper()
	clock := sluicetest.NewClock()
	return newHarnessStore(t, clock, newMemStore(t, clock), policies, opts)
}

// newHarnessStore serves the middleware over store. The Limiter's own
// clock (for deadlines) is the real one: context deadlines are real time.
func newHarnessStore(t *testing.T, clock *sluicetest.Clock, store sluice.Store, policies []sluice.Policy, opts httplimit.Options) *harness {
	t.Helper()
	l, err := sluice.New(store, policies, sluice.Options{})
	if err != nil {
		t.Fatalf("sluice.New: %v", err)
	}
	h := &harness{t: t, clock: clock, limiter: l, logs: &syncBuffer{}}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	opts.OnDecision = func(_ *http.Request, d httplimit.Decision) {
		h.mu.Lock()
		h.decisions = append(h.decisions, d)
		h.mu.Unlock()
	}
	if opts.Fallback == nil && needsFallback(opts) {
		opts.Fallback, opts.LocalShare = newMemStore(t, clock), 0.25
	}
	m, err := httplimit.New(l, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.srv = httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	t.Cleanup(h.srv.Close)
	return h
}

func needsFallback(opts httplimit.Options) bool {
	if opts.FailureMode == failure.Local {
		return true
	}
	for _, rt := range opts.Routes {
		if rt.FailureMode == failure.Local {
			return true
		}
	}
	return false
}

type response struct {
	*http.Response
	body string
}

// do sends a request over the socket; header is "Name: value" pairs.
func (h *harness) do(method, path string, header ...string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, kv := range header {
		k, v, _ := strings.Cut(kv, ": ")
		req.Header.Add(k, v)
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{resp, string(b)}
}

func (h *harness) last() httplimit.Decision {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.decisions) == 0 {
		h.t.Fatal("no decision recorded")
	}
	return h.decisions[len(h.decisions)-1]
}

func (h *harness) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.decisions)
}

func policy(id string, a sluice.Algorithm, limit int64, window time.Duration) sluice.Policy {
	return sluice.Policy{ID: id, Algorithm: a, Limit: limit, Window: window}
}

// member is one member of RateLimit-Policy or RateLimit as parsed: id,
// then key, value pairs of parameters.
func member(id string, params ...any) sfparse.Member {
	m := sfparse.Member{Value: id}
	for i := 0; i+1 < len(params); i += 2 {
		v := params[i+1]
		if n, ok := v.(int); ok {
			v = int64(n)
		}
		m.Params = append(m.Params, sfparse.Param{Key: params[i].(string), Value: v})
	}
	return m
}

func header(t *testing.T, resp response, name string) []sfparse.Member {
	t.Helper()
	v := resp.Header.Values(name)
	if len(v) != 1 {
		t.Fatalf("%s: %d field lines %q, want 1", name, len(v), v)
	}
	got, err := sfparse.ParseList(v[0])
	if err != nil {
		t.Fatalf("%s: %q is not an RFC 9651 list: %v", name, v[0], err)
	}
	return got
}

func wantHeader(t *testing.T, resp response, name string, want ...sfparse.Member) {
	t.Helper()
	if diff := cmp.Diff(want, header(t, resp, name)); diff != "" {
		t.Errorf("%s = %q, diff (-want +got):\n%s", name, resp.Header.Get(name), diff)
	}
}

type problemBody struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies"`
}

func wantProblem(t *testing.T, resp response, status int) problemBody {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, status, resp.body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", cc)
	}
	var p problemBody
	dec := json.NewDecoder(strings.NewReader(resp.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem body %q: %v", resp.body, err)
	}
	if p.Status != status {
		t.Errorf("problem status = %d, want %d", p.Status, status)
	}
	return p
}

func retryAfter(t *testing.T, resp response) int64 {
	t.Helper()
	v := resp.Header.Get("Retry-After")
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || strconv.FormatInt(n, 10) != v {
		t.Fatalf("Retry-After = %q, want delay-seconds >= 1", v)
	}
	return n
}

// ipUserAgent is the client address with the User-Agent, of kind
// "ip_user_agent" (sluice serve's proxy has such a subject).
func ipUserAgent(ips *subject.IPResolver) subject.KeyFunc {
	ip := subject.ClientIP(ips)
	return func(r *http.Request) (string, string) {
		kind, prefix := ip(r)
		if prefix == "" || r.UserAgent() == "" {
			return kind, prefix
		}
		return "ip_user_agent", prefix + " " + r.UserAgent()
	}
}

// headerSubject is subject.Header(name), for a valid name.
func headerSubject(t testing.TB, name string) subject.KeyFunc {
	t.Helper()
	f, err := subject.Header(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// clientIP is httplimit.ClientIP over a resolver of valid opts.
func clientIP(t testing.TB, opts subject.IPOptions) subject.KeyFunc {
	t.Helper()
	ips, err := subject.NewIPResolver(opts)
	if err != nil {
		t.Fatal(err)
	}
	return subject.ClientIP(ips)
}

// demoOptions limits /demo to the "demo" policy per account.
func demoOptions() httplimit.Options {
	return httplimit.Options{
		Routes: []httplimit.Route{{PathPrefix: "/demo", Policies: []string{"demo"}}},
		Subject: subject.FirstOf(subject.Principal(func(r *http.Request) (string, bool) {
			a := r.Header.Get("X-Account")
			return a, a != ""
		}), subject.ClientIP(nil)),
	}
}

func TestDemoSequence(t *testing.T) {
	h := newHarness(t, []sluice.Policy{policy("demo", sluice.FixedWindow, 3, 10*time.Second)}, demoOptions())
	for i, wantRemaining := range []int64{2, 1, 0} {
		h.clock.Advance(time.Second)
		resp := h.do("GET", "/demo", "X-Account: alice")
		if resp.StatusCode != 200 || resp.body != "ok" {
			t.Fatalf("request %d: GET /demo = %d %q, want 200 ok", i+1, resp.StatusCode, resp.body)
		}
		wantHeader(t, resp, "RateLimit-Policy", member("demo", "q", 3, "w", 10))
		d := h.last()
		wantHeader(t, resp, "RateLimit", member("demo", "r", wantRemaining, "t", int64(math.Ceil(d.Outcome.ResetAfter.Seconds()))))
		if d.Action != "admitted" || d.SubjectKind != "principal" {
			t.Errorf("request %d: decision %v/%s, want admitted/principal", i+1, d.Action, d.SubjectKind)
		}
		if resp.Header.Get("X-RateLimit-Limit") != "" {
			t.Error("X-RateLimit-Limit set without LegacyHeaders")
		}
	}

	h.clock.Advance(2500 * time.Millisecond)
	resp := h.do("GET", "/demo", "X-Account: alice")
	p := wantProblem(t, resp, http.StatusTooManyRequests)
	want := problemBody{
		Type:             "https://iana.org/assignments/http-problem-types#quota-exceeded",
		Title:            p.Title,
		Status:           429,
		Detail:           p.Detail,
		ViolatedPolicies: []string{"demo"},
	}
	if diff := cmp.Diff(want, p); diff != "" || p.Title == "" {
		t.Errorf("problem diff (-want +got):\n%s", diff)
	}
	d := h.last()
	if d.Action != "limited" || d.Status != 429 || d.Outcome.Kind != sluice.Denied {
		t.Fatalf("decision = %+v, want limited 429 denied", d)
	}
	got := retryAfter(t, resp)
	if min := int64(math.Ceil(d.Outcome.RetryAfter.Seconds())); got < min || got != max(min, 1) {
		t.Errorf("Retry-After = %d, want ceil(%v) = %d", got, d.Outcome.RetryAfter, min)
	}
	wantHeader(t, resp, "RateLimit", member("demo", "r", 0, "t", int64(math.Ceil(d.Outcome.ResetAfter.Seconds()))))
	wantHeader(t, resp, "RateLimit-Policy", member("demo", "q", 3, "w", 10))

	// Another account has its own budget; after Retry-After alice is back.
	if resp := h.do("GET", "/demo", "X-Account: bob"); resp.StatusCode != 200 {
		t.Errorf("bob: GET /demo = %d, want 200", resp.StatusCode)
	}
	h.clock.Advance(time.Duration(got) * time.Second)
	if resp := h.do("GET", "/demo", "X-Account: alice"); resp.StatusCode != 200 {
		t.Errorf("alice after Retry-After: GET /demo = %d, want 200", resp.StatusCode)
	}
	// Unrouted paths are not limited and carry no headers.
	for range 5 {
		resp := h.do("GET", "/other", "X-Account: alice")
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("GET /other = %d with RateLimit-Policy %q, want 200 and none", resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
		}
	}
}

func TestRetryAfterRoundsUp(t *testing.T) {
	// gcra 1 per 2.5s: the second request must wait 2.5s, answered as 3.
	h := newHarness(t, []sluice.Policy{policy("slow", sluice.GCRA, 1, 2500*time.Millisecond)}, httplimit.Options{
		Routes: []httplimit.Route{{Policies: []string{"slow"}}},
	})
	h.do("GET", "/")
	h.clock.Advance(time.Millisecond)
	resp := h.do("GET", "/")
	d := h.last()
	if d.Outcome.RetryAfter <= 2*time.Second || d.Outcome.RetryAfter >= 3*time.Second {
		t.Fatalf("RetryAfter = %v, want between 2s and 3s", d.Outcome.RetryAfter)
	}
	if got := retryAfter(t, resp); got != 3 {
		t.Errorf("Retry-After = %d for RetryAfter %v, want 3", got, d.Outcome.RetryAfter)
	}
	// 2.5s is not a whole number of seconds: w is left out, not misstated.
	wantHeader(t, resp, "RateLimit-Policy", member("slow", "q", 1))
}

func TestMultiplePolicies(t *testing.T) {
	h := newHarness(t, []sluice.Policy{
		policy("burst", sluice.SlidingLog, 2, time.Second),
		policy("hourly", sluice.FixedWindow, 5, time.Hour),
	}, httplimit.Options{
		Routes:        []httplimit.Route{{Methods: []string{"post"}, PathPrefix: "/api/", Policies: []string{"burst", "hourly"}}},
		Subject:       headerSubject(t, "X-API-Key"),
		LegacyHeaders: true,
	})
	resp := h.do("POST", "/api/orders", "X-API-Key: k-1")
	wantHeader(t, resp, "RateLimit-Policy", member("burst", "q", 2, "w", 1), member("hourly", "q", 5, "w", 3600))
	// The policy closest to exhaustion comes first.
	wantHeader(t, resp, "RateLimit", member("burst", "r", 1, "t", 1), member("hourly", "r", 4, "t", 3600))
	if d := h.last(); d.Operation != "POST /api" || d.SubjectKind != "api_key" {
		t.Errorf("decision operation %q kind %q, want \"POST /api\" api_key", d.Operation, d.SubjectKind)
	}
	for name, want := range map[string]string{"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "1"} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	h.do("POST", "/api/orders", "X-API-Key: k-1")
	resp = h.do("POST", "/api/orders", "X-API-Key: k-1")
	p := wantProblem(t, resp, 429)
	if diff := cmp.Diff([]string{"burst"}, p.ViolatedPolicies); diff != "" {
		t.Errorf("violated-policies diff (-want +got):\n%s", diff)
	}
	// The denying policy first, then the others as the store reported them
	// (what "remaining" means for a policy that would have admitted in a
	// denied multi-policy decision is the store's to say).
	d := h.last()
	if len(d.Outcome.Statuses) != 2 || d.Outcome.Statuses[1].Policy != "hourly" {
		t.Fatalf("statuses %+v, want burst and hourly", d.Outcome.Statuses)
	}
	hourly := d.Outcome.Statuses[1]
	wantHeader(t, resp, "RateLimit", member("burst", "r", 0, "t", 1), member("hourly", "r", hourly.Remaining, "t", int64(math.Ceil(hourly.ResetAfter.Seconds()))))
	// GET is not routed.
	if resp := h.do("GET", "/api/orders", "X-API-Key: k-1"); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Errorf("GET /api/orders = %d RateLimit %q, want 200 unlimited", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
}

func TestRouteMatching(t *testing.T) {
	h := newHarness(t, []sluice.Policy{policy("one", sluice.FixedWindow, 1, time.Minute)}, httplimit.Options{
		Routes: []httplimit.Route{
			{PathPrefix: "/login", Policies: []string{"one"}},
			{Operation: "search", Match: func(r *http.Request) bool { return r.URL.Query().Has("q") }, Policies: []string{"one"}},
			{Operation: "shared", PathPrefix: "/a", Policies: []string{"one"}},
			{Operation: "shared", PathPrefix: "/b", Policies: []string{"one"}},
			{Methods: []string{"get"}, PathPrefix: "/get", Policies: []string{"one"}},
		},
	})
	tests := []struct {
		method, path, wantOp string
		wantStatus           int
	}{
		{"GET", "/login", "* /login", 200},
		{"GET", "/x/../login", "* /login", 429}, // cleaned: the same route and budget
		{"GET", "/loginx", "", 200},             // no route
		{"GET", "/?q=1", "search", 200},         // its own budget
		{"GET", "/a", "shared", 200},
		{"GET", "/b/c", "shared", 429}, // the same operation: a shared budget
		{"HEAD", "/get", "GET /get", 200},
		{"GET", "/get", "GET /get", 429}, // HEAD spends GET's budget
		{"POST", "/get", "", 200},
	}
	for _, tt := range tests {
		before := h.count()
		resp := h.do(tt.method, tt.path)
		if resp.StatusCode != tt.wantStatus {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, resp.StatusCode, tt.wantStatus)
		}
		if tt.wantOp == "" {
			if h.count() != before {
				t.Errorf("%s %s recorded a decision, want none", tt.method, tt.path)
			}
			continue
		}
		if d := h.last(); d.Operation != tt.wantOp {
			t.Errorf("%s %s operation = %q, want %q", tt.method, tt.path, d.Operation, tt.wantOp)
		}
	}
}

func TestSubjectResolutionOrder(t *testing.T) {
	h := newHarness(t, []sluice.Policy{policy("p", sluice.FixedWindow, 100, time.Minute)}, httplimit.Options{
		Default: []string{"p"},
		Subject: subject.FirstOf(
			subject.Principal(func(r *http.Request) (string, bool) {
				u := r.Header.Get("X-User")
				return u, u != ""
			}),
			headerSubject(t, "X-API-Key"),
			subject.ClientIP(nil),
		),
	})
	for _, tt := range []struct {
		name   string
		header []string
		want   string
	}{
		{"principal first", []string{"X-User: u1", "X-API-Key: k1"}, "principal"},
		{"then API key", []string{"X-API-Key: k1"}, "api_key"},
		{"then IP, whatever the User-Agent", []string{"User-Agent: curl/8"}, "ip"},
		{"then IP", []string{"User-Agent: "}, "ip"},
	} {
		h.do("GET", "/", tt.header...)
		if d := h.last(); d.SubjectKind != tt.want || d.Operation != "*" {
			t.Errorf("%s: subject kind %q operation %q, want %q %q", tt.name, d.SubjectKind, d.Operation, tt.want, "*")
		}
	}
}

func TestAnonymous(t *testing.T) {
	policies := []sluice.Policy{policy("p", sluice.FixedWindow, 2, time.Minute)}
	opts := httplimit.Options{
		Routes: []httplimit.Route{{Policies: []string{"p"}, Subject: headerSubject(t, "X-API-Key")}},
	}
	t.Run("deny", func(t *testing.T) {
		h := newHarness(t, policies, opts)
		p := wantProblem(t, h.do("GET", "/"), http.StatusForbidden)
		if p.Type != "about:blank" {
			t.Errorf("problem type %q, want about:blank", p.Type)
		}
		if d := h.last(); d.Action != "no_subject" || d.Outcome.Kind != 0 || d.Subject != "" {
			t.Errorf("decision %+v, want no_subject without an outcome", d)
		}
	})
	t.Run("share", func(t *testing.T) {
		// A constant identity at the end of the chain pools the others.
		opts := opts
		opts.Routes = []httplimit.Route{{Policies: []string{"p"}, Subject: subject.FirstOf(headerSubject(t, "X-API-Key"), func(*http.Request) (string, string) { return "anonymous", "*" })}}
		h := newHarness(t, policies, opts)
		got := []int{h.do("GET", "/").StatusCode, h.do("GET", "/").StatusCode, h.do("GET", "/").StatusCode, h.do("GET", "/", "X-API-Key: k").StatusCode}
		if diff := cmp.Diff([]int{200, 200, 429, 200}, got); diff != "" {
			t.Errorf("statuses diff (-want +got):\n%s", diff)
		}
	})
}

// TestForwardedFor checks that the subject is the client IP only a trusted
// proxy can vouch for. The test client connects from 127.0.0.1.
func TestForwardedFor(t *testing.T) {
	policies := []sluice.Policy{policy("ip", sluice.FixedWindow, 1, time.Minute)}
	pseudo := subject.Unkeyed()
	ipSubject := func(prefix string) string { return pseudo.Pseudonym("ip", prefix, "* /") }
	base := httplimit.Options{
		Routes: []httplimit.Route{{Policies: []string{"ip"}}},
	}

	t.Run("untrusted peer", func(t *testing.T) {
		opts := base
		opts.Subject = clientIP(t, subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
		h := newHarness(t, policies, opts)
		if resp := h.do("GET", "/"); resp.StatusCode != 200 {
			t.Fatalf("first request = %d, want 200", resp.StatusCode)
		}
		for _, spoof := range []string{"203.0.113.9", "10.0.0.1", "198.51.100.1, 203.0.113.9", "unknown"} {
			resp := h.do("GET", "/", "X-Forwarded-For: "+spoof, "Forwarded: for="+spoof)
			if d := h.last(); resp.StatusCode != 429 || d.Subject != ipSubject("127.0.0.1/32") {
				t.Errorf("spoofed %q: status %d subject %q, want 429 and the peer's %q", spoof, resp.StatusCode, d.Subject, ipSubject("127.0.0.1/32"))
			}
		}
	})

	t.Run("trusted proxy", func(t *testing.T) {
		opts := base
		opts.Subject = clientIP(t, subject.IPOptions{TrustedProxies: []string{"127.0.0.0/8", "10.0.0.0/8"}})
		h := newHarness(t, policies, opts)
		steps := []struct {
			xff        []string
			wantIP     string
			wantStatus int
		}{
			{[]string{"198.51.100.1, 203.0.113.5"}, "203.0.113.5/32", 200},
			{[]string{"192.0.2.77, 203.0.113.5, 10.1.1.1"}, "203.0.113.5/32", 429}, // spoofed left entry, same client
			{[]string{"192.0.2.77", "203.0.113.5"}, "203.0.113.5/32", 429},         // two lines, joined
			{[]string{"203.0.113.6"}, "203.0.113.6/32", 200},
			{[]string{"2001:db8:1:2::1"}, "2001:db8:1:2::/64", 200},
			{[]string{"[2001:db8:1:2::99]:4711"}, "2001:db8:1:2::/64", 429}, // same /64
			{nil, "127.0.0.1/32", 200},                                      // no header: the proxy itself
		}
		for _, s := range steps {
			var hdr []string
			for _, v := range s.xff {
				hdr = append(hdr, "X-Forwarded-For: "+v)
			}
			resp := h.do("GET", "/", hdr...)
			if d := h.last(); resp.StatusCode != s.wantStatus || d.Subject != ipSubject(s.wantIP) {
				t.Errorf("X-Forwarded-For %q: status %d subject %q, want %d and %s's %q", s.xff, resp.StatusCode, d.Subject, s.wantStatus, s.wantIP, ipSubject(s.wantIP))
			}
		}
	})

	t.Run("trusted proxy, Forwarded", func(t *testing.T) {
		opts := base
		opts.Subject = clientIP(t, subject.IPOptions{TrustedProxies: []string{"127.0.0.1"}, Header: "Forwarded"})
		h := newHarness(t, policies, opts)
		resp := h.do("GET", "/", `Forwarded: for=198.51.100.1, for="[2001:db8:5::1]:4711";proto=https`, "X-Forwarded-For: 203.0.113.200")
		if d := h.last(); resp.StatusCode != 200 || d.Subject != ipSubject("2001:db8:5::/64") {
			t.Errorf("Forwarded: status %d subject %q, want 200 and 2001:db8:5::/64's", resp.StatusCode, d.Subject)
		}
	})
}

// blockingStore stands in for a store whose server accepts the connection
// but never answers: it waits for the context, as the Store contract asks,
// and reports that nothing was sent. A real store cannot be made to hang in
// this package's tests.
type blockingStore struct{}

func (blockingStore) Evaluate(ctx context.Context, _ *sluice.Evaluation) error {
	<-ctx.Done()
	return fmt.Errorf("blockingStore: %w", ctx.Err())
}

// failingStore fails every decision with err, the way a store reports a
// lost reply or corrupt state.
type failingStore struct{ err error }

func (s failingStore) Evaluate(context.Context, *sluice.Evaluation) error { return s.err }

func TestFailureModes(t *testing.T) {
	tests := []struct {
		name       string
		store      sluice.Store
		mode       failure.Mode
		wantStatus int
		wantAction string
		wantKind   sluice.Kind
		wantLog    string
	}{
		{"closed, store hangs", blockingStore{}, failure.Closed, 503, "failed_closed", sluice.Unavailable, "deadline_passed"},
		{"closed, reply lost", failingStore{fmt.Errorf("stub: %w", sluice.ErrIndeterminate)}, failure.Closed, 503, "failed_closed", sluice.Indeterminate, `"outcome":"indeterminate"`},
		{"closed, corrupt state", failingStore{fmt.Errorf("stub: counter is not an integer: %w", sluice.CorruptState)}, failure.Closed, 503, "failed_closed", sluice.Unavailable, "counter is not an integer"},
		{"open, store hangs", blockingStore{}, failure.Open, 200, "failed_open", sluice.Unavailable, `"action":"failed_open"`},
		{"open, circuit open", failingStore{fmt.Errorf("stub: %w", sluice.CircuitOpen)}, failure.Open, 200, "failed_open", sluice.Unavailable, "circuit_open"},
		{"the zero mode: closed", blockingStore{}, 0, 503, "failed_closed", sluice.Unavailable, "failed_closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policies := []sluice.Policy{policy("p", sluice.FixedWindow, 10, time.Minute), policy("q", sluice.FixedWindow, 10, time.Minute)}
			h := newHarnessStore(t, sluicetest.NewClock(), tt.store, policies, httplimit.Options{
				Routes:   []httplimit.Route{{Policies: []string{"p", "q"}, FailureMode: tt.mode}},
				Deadline: 50 * time.Millisecond,
			})
			resp := h.do("GET", "/") // answered at all: a hung store is cut off by the deadline (the test's timeout bounds a hang)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, resp.body, tt.wantStatus)
			}
			if tt.wantStatus == 503 {
				wantProblem(t, resp, 503)
				retryAfter(t, resp)
			}
			d := h.last()
			if d.Action != tt.wantAction || d.Outcome.Kind != tt.wantKind {
				t.Errorf("decision %v/%v (%v), want %v/%v", d.Action, d.Outcome.Kind, d.Outcome.Err, tt.wantAction, tt.wantKind)
			}
			if resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("RateLimit") != "" {
				t.Errorf("RateLimit-Policy %q RateLimit %q, want the policy field only (nothing was decided)", resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"))
			}
			if logs := h.logs.String(); !strings.Contains(logs, tt.wantLog) || !strings.Contains(logs, `"level":"WARN"`) {
				t.Errorf("logs %s: want a WARN record with %s", logs, tt.wantLog)
			}
		})
	}
}

// deadlineStore blocks like blockingStore and records the deadline of
// the context it was asked under and when it was asked.
type deadlineStore struct {
	deadline, asked chan time.Time
}

func (s deadlineStore) Evaluate(ctx context.Context, _ *sluice.Evaluation) error {
	s.asked <- time.Now()
	d, _ := ctx.Deadline()
	s.deadline <- d
	<-ctx.Done()
	return fmt.Errorf("deadlineStore: %w", ctx.Err())
}

// TestDefaultDeadline: without Options.Deadline a decision waits for the
// store edge.DefaultDeadline (500ms) from when the request came, then
// answers 503: the deadline the store is handed lies DefaultDeadline
// after some instant between the request's sending and the store's call
// (what is asserted is the configured bound, not a speed).
func TestDefaultDeadline(t *testing.T) {
	store := deadlineStore{deadline: make(chan time.Time, 1), asked: make(chan time.Time, 1)}
	h := newHarnessStore(t, sluicetest.NewClock(), store, []sluice.Policy{policy("p", sluice.FixedWindow, 1, time.Minute)}, httplimit.Options{
		Routes: []httplimit.Route{{Policies: []string{"p"}}},
	})
	sent := time.Now()
	resp := h.do("GET", "/")
	asked, deadline := <-store.asked, <-store.deadline
	if resp.StatusCode != 503 || deadline.Before(sent.Add(edge.DefaultDeadline)) || deadline.After(asked.Add(edge.DefaultDeadline)) {
		t.Errorf("status %d, the store's deadline %v after the request was sent (%v after it was asked), want 503 and DefaultDeadline (%v) from an instant between", resp.StatusCode, deadline.Sub(sent), deadline.Sub(asked), edge.DefaultDeadline)
	}
}

func TestLocalFallback(t *testing.T) {
	clock := sluicetest.NewClock()
	policies := []sluice.Policy{
		policy("api", sluice.FixedWindow, 8, time.Minute),
		policy("other", sluice.FixedWindow, 8, time.Minute),
	}
	h := newHarnessStore(t, clock, failingStore{fmt.Errorf("stub: connection refused: %w", sluice.FailedBeforeSend)}, policies, httplimit.Options{
		Routes: []httplimit.Route{{Policies: []string{"api", "other"}, FailureMode: failure.Local}},
	})
	var got []int
	for range 5 {
		got = append(got, h.do("GET", "/").StatusCode)
	}
	// A local share of 0.25 of 8 is 2.
	if diff := cmp.Diff([]int{200, 200, 429, 429, 429}, got); diff != "" {
		t.Errorf("statuses diff (-want +got):\n%s", diff)
	}
	d := h.last()
	if !d.Local || d.Outcome.Kind != sluice.Unavailable || d.LocalOutcome.Kind != sluice.Denied || d.Action != "limited" {
		t.Errorf("decision %+v, want a local denial after an unavailable store", d)
	}
	if !strings.Contains(h.logs.String(), `"local_outcome":"denied"`) {
		t.Errorf("logs %s: want the local outcome", h.logs.String())
	}
	clock.Advance(time.Minute)
	if resp := h.do("GET", "/"); resp.StatusCode != 200 {
		t.Errorf("after a minute: %d, want 200", resp.StatusCode)
	} else {
		wantHeader(t, resp, "RateLimit", member("api", "r", 1, "t", 60), member("other", "r", 1, "t", 60))
	}
}

func TestShadow(t *testing.T) {
	policies := []sluice.Policy{
		policy("p", sluice.FixedWindow, 1, time.Minute),
		policy("q", sluice.FixedWindow, 1, time.Minute),
	}
	t.Run("global", func(t *testing.T) {
		h := newHarness(t, policies, httplimit.Options{Default: []string{"p"}, Shadow: true})
		for i := range 3 {
			resp := h.do("GET", "/")
			if resp.StatusCode != 200 || resp.body != "ok" {
				t.Fatalf("request %d: %d %q, want 200 ok", i+1, resp.StatusCode, resp.body)
			}
			wantRemaining := int64(0)
			wantHeader(t, resp, "RateLimit", member("p", "r", wantRemaining, "t", 60))
			d := h.last()
			wantShadow := i > 0
			if d.Shadow != wantShadow || d.Status != 0 || (wantShadow && d.Action != "limited") {
				t.Errorf("request %d: decision action %v shadow %v status %d, want shadow=%v and status 0", i+1, d.Action, d.Shadow, d.Status, wantShadow)
			}
		}
		if n := strings.Count(h.logs.String(), `"action":"limited","subject_kind":"ip"`); n != 2 {
			t.Errorf("logs %s: %d would-be denials, want 2", h.logs.String(), n)
		}
		if !strings.Contains(h.logs.String(), `"level":"INFO","msg":"rate limit decision (shadow: not enforced)"`) {
			t.Errorf("logs %s: want shadow records at INFO", h.logs.String())
		}
	})
	t.Run("per route, and failures", func(t *testing.T) {
		h := newHarness(t, policies, httplimit.Options{Routes: []httplimit.Route{
			{PathPrefix: "/shadow", Policies: []string{"p"}, Shadow: true},
			{PathPrefix: "/enforced", Policies: []string{"q"}},
		}})
		got := []int{h.do("GET", "/shadow").StatusCode, h.do("GET", "/shadow").StatusCode, h.do("GET", "/enforced").StatusCode, h.do("GET", "/enforced").StatusCode}
		if diff := cmp.Diff([]int{200, 200, 200, 429}, got); diff != "" {
			t.Errorf("statuses diff (-want +got):\n%s", diff)
		}
		h2 := newHarnessStore(t, sluicetest.NewClock(), blockingStore{}, policies, httplimit.Options{Default: []string{"p"}, Shadow: true, Deadline: 10 * time.Millisecond})
		if resp := h2.do("GET", "/"); resp.StatusCode != 200 {
			t.Errorf("shadow with a hanging store: %d, want 200", resp.StatusCode)
		}
		if d := h2.last(); d.Action != "failed_closed" || !d.Shadow {
			t.Errorf("decision %v shadow %v, want failed_closed not enforced", d.Action, d.Shadow)
		}
	})
}

// TestRawSubjectNeverLogged drives allowed, denied, failed and anonymous
// decisions with a raw API key and client IP, and greps everything the
// middleware emits for them.
func TestRawSubjectNeverLogged(t *testing.T) {
	const apiKey, clientIP = "sk_live_5f3a9c0d77e1", "203.0.113.77"
	key, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123")}})
	if err != nil {
		t.Fatal(err)
	}
	policies := []sluice.Policy{policy("p", sluice.FixedWindow, 1, time.Minute)}
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"127.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	opts := httplimit.Options{
		Routes: []httplimit.Route{
			{PathPrefix: "/key", Policies: []string{"p"}, Subject: headerSubject(t, "X-API-Key")},
			{PathPrefix: "/ip", Policies: []string{"p"}, Subject: subject.ClientIP(ips)},
			{PathPrefix: "/ua", Policies: []string{"p"}, Subject: ipUserAgent(ips)},
		},
		Pseudonymizer: key,
	}
	h := newHarness(t, policies, opts)
	hf := newHarnessStore(t, sluicetest.NewClock(), failingStore{fmt.Errorf("stub: %w", sluice.CorruptState)}, policies, opts)
	for _, hh := range []*harness{h, hf} {
		for range 2 {
			hh.do("GET", "/key", "X-API-Key: "+apiKey)
			hh.do("GET", "/ip", "X-Forwarded-For: "+clientIP)
			hh.do("GET", "/ua", "X-Forwarded-For: "+clientIP, "User-Agent: secret-agent/1.0")
		}
		logs := hh.logs.String()
		if strings.Count(logs, "\n") < 6 {
			t.Fatalf("only %d log records, want one per request:\n%s", strings.Count(logs, "\n"), logs)
		}
		for _, raw := range []string{apiKey, clientIP, "secret-agent"} {
			if strings.Contains(logs, raw) {
				t.Errorf("logs contain the raw %q:\n%s", raw, logs)
			}
			hh.mu.Lock()
			if s := fmt.Sprintf("%+v", hh.decisions); strings.Contains(s, raw) {
				t.Errorf("decisions contain the raw %q: %s", raw, s)
			}
			hh.mu.Unlock()
		}
		if !strings.Contains(logs, `"subject":"k1:`) {
			t.Errorf("logs %s: want the keyed pseudonym", logs)
		}
	}
}

func TestNewErrors(t *testing.T) {
	clock := sluicetest.NewClock()
	l, err := sluice.New(newMemStore(t, clock), []sluice.Policy{
		policy("p", sluice.FixedWindow, 1, time.Minute),
		policy("local", sluice.FixedWindow, 1, time.Minute),
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		opts    httplimit.Options
		wantErr string
	}{
		{"unknown failure mode", httplimit.Options{Default: []string{"p"}, FailureMode: 7}, "httplimit: Default.FailureMode = FailureMode(7): must be one of closed, open, local"},
		{"unknown policy", httplimit.Options{Default: []string{"nope"}}, `httplimit: Default.Policies[0] = "nope": the limiter has no such policy; it has p, local`},
		{"typo in a route's policy", httplimit.Options{Routes: []httplimit.Route{{PathPrefix: "/x", Policies: []string{"p"}}, {PathPrefix: "/y", Policies: []string{"q"}}}}, `httplimit: Routes[1].Policies[0] = "q": the limiter has no such policy; it has p, local`},
		{"no policies", httplimit.Options{Routes: []httplimit.Route{{PathPrefix: "/x"}}}, "httplimit: Routes[0].Policies = []: at least one policy ID is required"},
		{"policy twice", httplimit.Options{Routes: []httplimit.Route{{Policies: []string{"p", "p"}}}}, `httplimit: Routes[0].Policies[1] = "p": is named twice`},
		{"match without operation", httplimit.Options{Routes: []httplimit.Route{{Match: func(*http.Request) bool { return true }, Policies: []string{"p"}}}}, `httplimit: Routes[0].Operation = "": is required with Match`},
		{"relative prefix", httplimit.Options{Routes: []httplimit.Route{{PathPrefix: "api", Policies: []string{"p"}}}}, `httplimit: Routes[0].PathPrefix = "api": must start with "/"`},
		{"bad method", httplimit.Options{Routes: []httplimit.Route{{Methods: []string{"GET", "PO ST"}, Policies: []string{"p"}}}}, `httplimit: Routes[0].Methods[1] = "PO ST": must be an HTTP method`},
		{"local without fallback", httplimit.Options{Default: []string{"local"}, FailureMode: failure.Local}, `httplimit: Default.FailureMode = local: is local, but Options.Fallback is nil`},
		{"unreachable route", httplimit.Options{Routes: []httplimit.Route{{PathPrefix: "/a", Policies: []string{"p"}}, {PathPrefix: "/a/", Policies: []string{"p"}}}}, `httplimit: Routes[1].Operation = "* /a" (the default): is also Routes[0]'s`},
		{"negative deadline", httplimit.Options{Deadline: -time.Second}, "httplimit: Deadline = -1s: must not be negative"},
		{"negative cost", httplimit.Options{Routes: []httplimit.Route{{Policies: []string{"p"}, Cost: -1}}}, "httplimit: Routes[0].Cost = -1: must not be negative"},
		{"cost above max cost", httplimit.Options{Routes: []httplimit.Route{{Policies: []string{"p"}, Cost: 2}}}, `httplimit: Routes[0].Cost = 2: must be at most the max cost of policy "p", 1`},
		{"bad idempotency header", httplimit.Options{IdempotencyKeyHeader: "Idempotency Key"}, `httplimit: IdempotencyKeyHeader = "Idempotency Key": must be a header name`},
	}
	for _, tt := range tests {
		_, err := httplimit.New(l, tt.opts)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: New error = %v, want one containing %q", tt.name, err, tt.wantErr)
		}
	}
	if _, err := httplimit.New(nil, httplimit.Options{}); err == nil {
		t.Error("New(nil limiter) = nil error, want one")
	}
	for _, name := range []string{"", "X-API-Key:", "X API"} {
		if _, err := subject.Header(name); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("subject: Header(%q): must be a header name", name)) {
			t.Errorf("Header(%q) = %v, want an error naming it", name, err)
		}
	}
}

func TestConcurrentRequestsAdmitExactlyTheLimit(t *testing.T) {
	h := newHarness(t, []sluice.Policy{policy("p", sluice.SlidingLog, 10, time.Minute)}, httplimit.Options{
		Default: []string{"p"},
	})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	for range 40 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", h.srv.URL, nil)
			resp, err := h.srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if diff := cmp.Diff(map[int]int{200: 10, 429: 30}, statuses); diff != "" {
		t.Errorf("statuses diff (-want +got):\n%s", diff)
	}
}

// TestLocalQuota: requests of one API key on a local_quota policy are
// admitted from the Limiter's blocks over a real socket, and answered
// with the RateLimit fields as any other.
func TestLocalQuota(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	tally := new(localquota.Tally)
	lim, err := sluice.New(store, []sluice.Policy{{ID: "api", Algorithm: sluice.FixedWindow, Limit: 1_000_000, Window: time.Minute, LocalQuota: sluice.LocalQuota{Enabled: true}}}, sluice.Options{OnLocalQuota: tally.Add})
	if err != nil {
		t.Fatal(err)
	}
	key, err := subject.Header("X-API-Key")
	if err != nil {
		t.Fatal(err)
	}
	m, err := httplimit.New(lim, httplimit.Options{Default: []string{"api"}, Subject: key})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	// Blocks come once the key has asked enough over three block times
	// (300ms): ask for at most 10s, until some requests came from one.
	for i, end := 0, time.Now().Add(10*time.Second); tally.Stats("api").Local < 20 && time.Now().Before(end); i++ {
		req, _ := http.NewRequest("GET", srv.URL+"/items", nil)
		req.Header.Set("X-API-Key", "k-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit") == "" {
			t.Fatalf("request %d = %d with RateLimit %q, want 200 with the field", i+1, resp.StatusCode, resp.Header.Get("RateLimit"))
		}
	}
	if st := tally.Stats("api"); st.Local == 0 {
		t.Errorf("local quota did %+v after 10s of requests of one key: want requests admitted from blocks", st)
	}
}
