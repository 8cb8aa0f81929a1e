package httplimit_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/engine/algorithm"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// serveWith serves next behind m on a real loopback socket.
func serveWith(t *testing.T, m *httplimit.Middleware, next http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(m.Handler(next))
	t.Cleanup(srv.Close)
	return srv
}

// get sends a GET with "Name: value" header pairs and returns the status
// and body.
func get(t *testing.T, srv *httptest.Server, path string, header ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest("GET", srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range header {
		k, v, _ := strings.Cut(kv, ": ")
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
}

func newLimiter(t *testing.T, clock *sluicetest.Clock, policies ...sluice.Policy) *sluice.Limiter {
	t.Helper()
	l, err := sluice.New(newMemStore(t, clock), policies, sluice.Options{})
	if err != nil {
		t.Fatalf("sluice.New: %v", err)
	}
	return l
}

func newMiddleware(t *testing.T, l *sluice.Limiter, opts httplimit.Options) *httplimit.Middleware {
	t.Helper()
	m, err := httplimit.New(l, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

// A client that sends a new User-Agent with every request must not get a
// new budget: the default subject is the client address.
func TestRotatingUserAgentCannotEscapeTheDefault(t *testing.T) {
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock, policy("p", sluice.FixedWindow, 3, time.Minute))
	for name, m := range map[string]*httplimit.Middleware{
		"New":   newMiddleware(t, l, httplimit.Options{Default: []string{"p"}}),
		"PerIP": mustPerIP(t, clock, policy("p", sluice.FixedWindow, 3, time.Minute)),
	} {
		srv := serveWith(t, m, okHandler())
		var got []int
		for i := range 10 {
			code, _, _ := get(t, srv, "/", fmt.Sprintf("User-Agent: agent/%d", i))
			got = append(got, code)
		}
		want := []int{200, 200, 200, 429, 429, 429, 429, 429, 429, 429}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: statuses with a rotating User-Agent, diff (-want +got):\n%s", name, diff)
		}
	}
}

func mustPerIP(t *testing.T, clock *sluicetest.Clock, p sluice.Policy) *httplimit.Middleware {
	t.Helper()
	m, err := httplimit.PerIP(newMemStore(t, clock), p, httplimit.Options{})
	if err != nil {
		t.Fatalf("PerIP: %v", err)
	}
	return m
}

func TestPerIP(t *testing.T) {
	clock := sluicetest.NewClock()
	srv := serveWith(t, mustPerIP(t, clock, policy("api", sluice.FixedWindow, 2, 10*time.Second)), okHandler())
	var got []string
	for range 3 {
		code, _, h := get(t, srv, "/anything")
		got = append(got, fmt.Sprint(code, " ", h.Get("RateLimit"), " ", h.Get("Retry-After")))
	}
	want := []string{`200 "api";r=1;t=10 `, `200 "api";r=0;t=10 `, `429 "api";r=0;t=10 10`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PerIP answers, diff (-want +got):\n%s", diff)
	}
	clock.Advance(10 * time.Second)
	if code, _, _ := get(t, srv, "/"); code != 200 {
		t.Errorf("after the window: status %d, want 200", code)
	}
}

func TestPerIPErrors(t *testing.T) {
	clock := sluicetest.NewClock()
	store := newMemStore(t, clock)
	good := policy("api", sluice.GCRA, 10, time.Second)
	for _, tt := range []struct {
		name string
		p    sluice.Policy
		opts httplimit.Options
		want string
	}{
		{"invalid policy", policy("api", sluice.GCRA, 0, time.Second), httplimit.Options{}, `httplimit: PerIP: sluice: New: policies[0]: policy "api": limit = 0: must be between 1 and 1000000000`},
		{"routes", good, httplimit.Options{Routes: []httplimit.Route{{Policies: []string{"api"}}}}, "httplimit: PerIP: Options.Routes is set: PerIP limits every request by one policy; use New"},
		{"default", good, httplimit.Options{Default: []string{"api"}}, "httplimit: PerIP: Options.Default is set"},
		{"bad option", good, httplimit.Options{Deadline: -1}, "httplimit: Deadline = -1ns: must not be negative"},
		{"local", policy("api", sluice.GCRA, 10, time.Second), httplimit.Options{FailureMode: failure.Local}, `httplimit: Default.FailureMode = local: is local, but Options.Fallback is nil`},
	} {
		_, err := httplimit.PerIP(store, tt.p, tt.opts)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: PerIP error = %v, want one containing %q", tt.name, err, tt.want)
		}
	}
}

func TestDenyHandler(t *testing.T) {
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock, policy("p", sluice.FixedWindow, 1, 10*time.Second))
	m := newMiddleware(t, l, httplimit.Options{
		Default: []string{"p"},
		Deny: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, ok := httplimit.FromContext(r.Context())
			if !ok {
				t.Error("Deny: no decision in the context")
			}
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(d.Status)
			fmt.Fprintf(w, "slow down: %s by %s, %v", d.Action, d.Outcome.Policy, d.Outcome.RetryAfter)
		}),
	})
	srv := serveWith(t, m, okHandler())
	if code, body, _ := get(t, srv, "/"); code != 200 || body != "ok" {
		t.Fatalf("first request: %d %q, want 200 ok", code, body)
	}
	code, body, h := get(t, srv, "/")
	if code != 429 || body != "slow down: limited by p, 10s" {
		t.Errorf("denied request: %d %q, want 429 and the custom body", code, body)
	}
	if h.Get("Retry-After") != "10" || h.Get("RateLimit") != `"p";r=0;t=10` || h.Get("Content-Type") != "text/plain" {
		t.Errorf("denied request headers: %v, want Retry-After 10, RateLimit and the handler's Content-Type", h)
	}
}

func TestDecisionInHandler(t *testing.T) {
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock, policy("search", sluice.TokenBucket, 10, time.Minute))
	m := newMiddleware(t, l, httplimit.Options{
		Routes: []httplimit.Route{{PathPrefix: "/search", Policies: []string{"search"}, Cost: 4}},
	})
	srv := serveWith(t, m, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := httplimit.FromContext(r.Context())
		if !ok {
			io.WriteString(w, "unlimited")
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"action": d.Action, "cost": d.Cost, "remaining": d.Outcome.Remaining})
	}))
	var got []string
	for range 3 {
		code, body, _ := get(t, srv, "/search")
		got = append(got, fmt.Sprint(code, " ", strings.TrimSpace(body)))
	}
	_, body, _ := get(t, srv, "/elsewhere")
	got = append(got, body)
	want := []string{
		`200 {"action":"admitted","cost":4,"remaining":6}`,
		`200 {"action":"admitted","cost":4,"remaining":2}`,
		`429 {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"Too many requests; retry in 12 s.","violated-policies":["search"]}`,
		"unlimited",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answers, diff (-want +got):\n%s", diff)
	}
}

func TestIdempotencyKey(t *testing.T) {
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock, policy("p", sluice.FixedWindow, 3, time.Minute))
	m := newMiddleware(t, l, httplimit.Options{Default: []string{"p"}, IdempotencyKeyHeader: "Idempotency-Key"})
	srv := serveWith(t, m, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := httplimit.FromContext(r.Context())
		fmt.Fprintf(w, "remaining=%d replayed=%v", d.Outcome.Remaining, d.Outcome.Replayed)
	}))
	var got []string
	for _, key := range []string{"order-1", "order-1", "order 2 with spaces and ünicode", "order-1", ""} {
		_, body, _ := get(t, srv, "/", "Idempotency-Key: "+key)
		got = append(got, body)
	}
	want := []string{
		"remaining=2 replayed=false",
		"remaining=2 replayed=true", // the retry is not charged again
		"remaining=1 replayed=false",
		"remaining=2 replayed=true",
		"remaining=0 replayed=false", // no key: every request spends
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answers, diff (-want +got):\n%s", diff)
	}
}

func TestRefund(t *testing.T) {
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock,
		policy("p", sluice.SlidingLog, 2, time.Minute),
		policy("estimate", sluice.SlidingWindow, 2, time.Minute))
	m := newMiddleware(t, l, httplimit.Options{Routes: []httplimit.Route{
		{PathPrefix: "/estimate", Policies: []string{"estimate"}},
		{PathPrefix: "/", Policies: []string{"p"}},
	}})
	srv := serveWith(t, m, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fail") == "" {
			io.WriteString(w, "done")
			return
		}
		// The work failed before it was done: give the unit back, twice.
		first, second := httplimit.Refund(r.Context()), httplimit.Refund(r.Context())
		fmt.Fprintf(w, "refund: %s remaining=%d not refundable=%v; again: %s nothing spent=%v", first.Kind, first.Remaining, errors.Is(first.Err, algorithm.ErrNotRefundable), second.Kind, errors.Is(second.Err, sluice.ErrInvalidRequest))
	}))
	var got []string
	for _, path := range []string{"/?fail=1", "/?fail=1", "/", "/", "/?fail=1", "/estimate?fail=1"} {
		code, body, _ := get(t, srv, path)
		if code != 200 {
			body = fmt.Sprint(code)
		}
		got = append(got, body)
	}
	want := []string{
		"refund: allowed remaining=2 not refundable=false; again: incompatible nothing spent=true",
		"refund: allowed remaining=2 not refundable=false; again: incompatible nothing spent=true",
		"done",
		"done",
		"429", // the refunds left exactly two for the work that was done
		"refund: incompatible remaining=0 not refundable=true; again: incompatible nothing spent=false",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answers, diff (-want +got):\n%s", diff)
	}
	if o := httplimit.Refund(t.Context()); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
		t.Errorf("Refund outside a limited request = %+v, want Incompatible with sluice.ErrInvalidRequest", o)
	}
}

// An API that authenticates by key answers a request without one with its
// own 401, not the limiter's 403.
func TestPassAnonymous(t *testing.T) {
	key, err := subject.Header("X-API-Key")
	if err != nil {
		t.Fatal(err)
	}
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock, policy("p", sluice.FixedWindow, 1, time.Minute))
	m := newMiddleware(t, l, httplimit.Options{
		Default:       []string{"p"},
		Subject:       key,
		PassAnonymous: true,
	})
	srv := serveWith(t, m, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") == "" {
			d, _ := httplimit.FromContext(r.Context())
			w.Header().Set("WWW-Authenticate", "ApiKey")
			http.Error(w, "no API key ("+d.Action+")", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "ok")
	}))
	var got []string
	for _, h := range []string{"X-Other: 1", "X-API-Key: k1", "X-API-Key: k1", "X-Other: 1"} {
		code, body, _ := get(t, srv, "/", h)
		got = append(got, fmt.Sprint(code, " ", strings.TrimSpace(body)))
	}
	want := []string{"401 no API key (no_subject)", "200 ok", `429 {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"Too many requests; retry in 60 s.","violated-policies":["p"]}`, "401 no API key (no_subject)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answers, diff (-want +got):\n%s", diff)
	}
}

// TestStrictPaths: with Options.StrictPaths a path servers read
// differently is answered 400 before the limiter, and the next handler
// reads the others in the normal form the routes matched.
func TestStrictPaths(t *testing.T) {
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock, policy("p", sluice.FixedWindow, 1, time.Minute))
	m := newMiddleware(t, l, httplimit.Options{
		Routes:      []httplimit.Route{{PathPrefix: "/login", Policies: []string{"p"}}},
		StrictPaths: true,
	})
	srv := serveWith(t, m, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.EscapedPath())
	}))
	var got []string
	for _, p := range []string{"/x/%2e%2e/login", "/login", "//login", "/login%2F", "/login%00", "/docs//a/%7e/./b"} {
		code, body, _ := get(t, srv, p)
		if code == 400 {
			var prob struct{ Detail string }
			if err := json.Unmarshal([]byte(body), &prob); err != nil {
				t.Fatalf("400 body %q: %v", body, err)
			}
			body = prob.Detail
		}
		got = append(got, fmt.Sprint(code, " ", strings.TrimSpace(body)))
	}
	want := []string{
		"200 /login",
		"429 " + `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"Too many requests; retry in 60 s.","violated-policies":["p"]}`,
		"429 " + `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"Too many requests; retry in 60 s.","violated-policies":["p"]}`,
		"400 The request path holds an encoded slash (%2F), which servers read differently.",
		"400 The request path holds an encoded NUL or control byte, which servers read differently.",
		"200 /docs/a/~/b",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answers, diff (-want +got):\n%s", diff)
	}
}

// TestRouteSubject: a route's own SubjectFunc replaces Options.Subject
// for that route only.
func TestRouteSubject(t *testing.T) {
	clock := sluicetest.NewClock()
	l := newLimiter(t, clock, policy("p", sluice.FixedWindow, 1, time.Minute))
	key, err := subject.Header("X-API-Key")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	m := newMiddleware(t, l, httplimit.Options{
		Routes: []httplimit.Route{
			{PathPrefix: "/keyed", Policies: []string{"p"}, Subject: key},
			{PathPrefix: "/", Policies: []string{"p"}},
		},
		OnDecision: func(_ *http.Request, d httplimit.Decision) { kinds = append(kinds, d.Action+"/"+d.SubjectKind) },
	})
	srv := serveWith(t, m, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	get(t, srv, "/keyed", "X-API-Key: k1")
	get(t, srv, "/keyed")
	get(t, srv, "/other", "X-API-Key: k1")
	if diff := cmp.Diff([]string{"admitted/api_key", "no_subject/", "admitted/ip"}, kinds); diff != "" {
		t.Errorf("decisions, diff (-want +got):\n%s", diff)
	}
}
