package sluiceclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluiceclient"
	"github.com/sluicehq/sluice/subject"
)

// The tests run on the real clock with hour-long windows, so no verdict
// depends on how fast the machine is.
var policies = []sluice.Policy{
	{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour},
	{ID: "daily", Algorithm: sluice.SlidingLog, Limit: 10, Window: 24 * time.Hour},
	{ID: "reports", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: time.Hour},
	{ID: "hourly", Algorithm: sluice.GCRA, Limit: 1, Window: time.Hour, MaxWait: 2 * time.Hour},
}

// checkServer is the check API of sluice serve on a loopback socket. The
// first lose answers are lost: the server decides, then the connection
// is closed without a reply.
type checkServer struct {
	url      string
	requests atomic.Int64
	lose     atomic.Int64
}

func startServer(t *testing.T, store sluice.Store, opts server.Options, tls bool) (*checkServer, *httptest.Server) {
	t.Helper()
	if store == nil {
		ms, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		store = ms
	}
	lim, err := sluice.New(store, policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	api, err := server.New(lim, subject.Unkeyed(), slog.New(slog.DiscardHandler), opts)
	if err != nil {
		t.Fatal(err)
	}
	cs := &checkServer{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.requests.Add(1)
		if cs.lose.Add(-1) < 0 {
			cs.lose.Store(0)
			api.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(httptest.NewRecorder(), r) // decided, spent, remembered
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close() // the answer is lost
	})
	var ts *httptest.Server
	if tls {
		ts = httptest.NewTLSServer(h)
	} else {
		ts = httptest.NewServer(h)
	}
	t.Cleanup(ts.Close)
	cs.url = ts.URL
	return cs, ts
}

func newClient(t *testing.T, url string, opts sluiceclient.Options) *sluiceclient.Client {
	t.Helper()
	opts.RetryBackoff = time.Millisecond
	c, err := sluiceclient.New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func peek(t *testing.T, c *sluiceclient.Client, subj string) int64 {
	t.Helper()
	o := c.Check(t.Context(), sluice.Request{Op: sluice.Peek, Policy: "demo", Subject: subj})
	if o.Kind != sluice.Allowed && o.Kind != sluice.Denied {
		t.Fatalf("peek: %v %v", o.Kind, o.Err)
	}
	return o.Remaining
}

func TestCheckOutcomes(t *testing.T) {
	cs, _ := startServer(t, nil, server.Options{}, false)
	c := newClient(t, cs.url, sluiceclient.Options{})
	ctx := t.Context()
	for i, want := range []int64{2, 1, 0} {
		o := c.Check(ctx, sluice.Request{Policy: "demo", Subject: "alice"})
		if o.Kind != sluice.Allowed || o.Policy != "demo" || o.Limit != 3 || o.Remaining != want || o.ResetAfter <= 0 || o.Err != nil {
			t.Fatalf("check %d = %+v, want allowed with %d remaining", i+1, o, want)
		}
	}
	o := c.Check(ctx, sluice.Request{Policy: "demo", Subject: "alice"})
	if o.Kind != sluice.Denied || o.RetryAfter <= 0 || o.Remaining != 0 {
		t.Errorf("fourth check = %+v, want denied with a retry-after", o)
	}
	o = c.Check(ctx, sluice.Request{Op: sluice.Refund, Policy: "demo", Subject: "alice", Cost: 2})
	if o.Kind != sluice.Allowed || o.Remaining != 2 {
		t.Errorf("refund of 2 = %+v, want allowed with 2 remaining", o)
	}
	o = c.Check(ctx, sluice.Request{Policies: []string{"demo", "daily"}, Subject: "bob", Cost: 3})
	if o.Kind != sluice.Allowed || o.Policy != "demo" || len(o.Statuses) != 2 || o.Statuses[1].Policy != "daily" || o.Statuses[1].Remaining != 7 {
		t.Errorf("multi-policy check = %+v, want allowed, demo most restrictive, daily with 7 remaining", o)
	}
	for _, tc := range []struct {
		name string
		req  sluice.Request
		want error
	}{
		{"unknown policy", sluice.Request{Policy: "nope", Subject: "alice"}, policyerr.ErrUnknownPolicy},
		{"no subject", sluice.Request{Policy: "demo"}, sluice.ErrInvalidRequest},
		{"negative cost", sluice.Request{Policy: "demo", Subject: "alice", Cost: -1}, sluice.ErrInvalidRequest},
		{"cost above max", sluice.Request{Policy: "demo", Subject: "alice", Cost: 4}, algorithm.ErrCostTooHigh},
	} {
		o := c.Check(ctx, tc.req)
		if o.Kind != sluice.Incompatible || o.Err == nil || (tc.want != nil && !errors.Is(o.Err, tc.want)) {
			t.Errorf("%s: outcome %+v, want incompatible with %v", tc.name, o, tc.want)
		}
	}
}

func TestLostAnswerIsRetriedWithTheSameEvaluationID(t *testing.T) {
	cs, _ := startServer(t, nil, server.Options{}, false)
	c := newClient(t, cs.url, sluiceclient.Options{})
	cs.lose.Store(1)
	o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "carol"})
	if o.Kind != sluice.Allowed || !o.Replayed || o.Remaining != 2 {
		t.Fatalf("check with its first answer lost = %+v, want the replayed first decision (allowed, 2 remaining)", o)
	}
	if n := cs.requests.Load(); n != 2 {
		t.Errorf("server saw %d requests, want 2 (the first and one retry)", n)
	}
	if r := peek(t, c, "carol"); r != 2 {
		t.Errorf("remaining after a lost answer and a retry = %d, want 2: spent once", r)
	}
}

func TestEveryAnswerLost(t *testing.T) {
	cs, _ := startServer(t, nil, server.Options{}, false)
	c := newClient(t, cs.url, sluiceclient.Options{Retries: 3})
	cs.lose.Store(10)
	o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "dave"})
	if o.Kind != sluice.Indeterminate || !errors.Is(o.Err, sluice.ErrIndeterminate) {
		t.Fatalf("check with every answer lost = %+v, want indeterminate", o)
	}
	if n := cs.requests.Load(); n != 4 {
		t.Errorf("server saw %d requests, want 4 (the first and three retries)", n)
	}
	cs.lose.Store(0)
	if r := peek(t, c, "dave"); r != 2 {
		t.Errorf("remaining = %d, want 2: four attempts with one evaluation ID spend once", r)
	}

	none := newClient(t, cs.url, sluiceclient.Options{Retries: -1})
	cs.lose.Store(1)
	cs.requests.Store(0)
	if o := none.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "erin"}); o.Kind != sluice.Indeterminate || cs.requests.Load() != 1 {
		t.Errorf("Retries -1: outcome %v after %d requests, want indeterminate after 1", o.Kind, cs.requests.Load())
	}
}

// indeterminateOnce decides with the real store, then reports the reply
// lost the first time, as a Redis connection reset after the write would.
type indeterminateOnce struct {
	sluice.Store
	once sync.Once
}

func (s *indeterminateOnce) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	err := s.Store.Evaluate(ctx, ev)
	lost := false
	s.once.Do(func() { lost = true })
	if lost && err == nil {
		return fmt.Errorf("connection reset: %w", sluice.ErrIndeterminate)
	}
	return err
}

func TestIndeterminateAnswerIsRetried(t *testing.T) {
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	cs, _ := startServer(t, &indeterminateOnce{Store: ms}, server.Options{}, false)
	c := newClient(t, cs.url, sluiceclient.Options{})
	o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "frank", EvaluationID: "order-42"})
	if o.Kind != sluice.Allowed || !o.Replayed || o.Remaining != 2 {
		t.Fatalf("check answered indeterminate first = %+v, want the replayed decision", o)
	}
	if n := cs.requests.Load(); n != 2 {
		t.Errorf("server saw %d requests, want 2", n)
	}
}

func TestTokensOverTLS(t *testing.T) {
	tokens := []server.Token{
		{ID: "app", Secret: []byte("app-secret-0123456789"), Scopes: []string{"check"}},
		{ID: "ops", Secret: []byte("ops-secret-0123456789"), Scopes: []string{"check", "refund"}},
	}
	cs, ts := startServer(t, nil, server.Options{Tokens: tokens}, true)
	app := newClient(t, cs.url, sluiceclient.Options{Token: "app-secret-0123456789", HTTPClient: ts.Client()})
	ops := newClient(t, cs.url, sluiceclient.Options{Token: "ops-secret-0123456789", HTTPClient: ts.Client()})
	anon := newClient(t, cs.url, sluiceclient.Options{HTTPClient: ts.Client()})
	ctx := t.Context()
	if o := app.Check(ctx, sluice.Request{Policy: "demo", Subject: "gina"}); o.Kind != sluice.Allowed {
		t.Errorf("check with the app token = %+v, want allowed", o)
	}
	if o := anon.Check(ctx, sluice.Request{Policy: "demo", Subject: "gina"}); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluiceclient.ErrUnauthenticated) {
		t.Errorf("check without a token = %+v, want ErrUnauthenticated", o)
	}
	if o := app.Check(ctx, sluice.Request{Op: sluice.Refund, Policy: "demo", Subject: "gina"}); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluiceclient.ErrForbidden) {
		t.Errorf("refund with the check-only token = %+v, want ErrForbidden", o)
	}
	if o := ops.Check(ctx, sluice.Request{Op: sluice.Refund, Policy: "demo", Subject: "gina"}); o.Kind != sluice.Allowed || o.Remaining != 3 {
		t.Errorf("refund with the ops token = %+v, want allowed with 3 remaining", o)
	}
	// The system roots do not trust the test certificate: nothing is sent.
	untrusted := newClient(t, cs.url, sluiceclient.Options{Token: "app-secret-0123456789"})
	if o := untrusted.Check(ctx, sluice.Request{Policy: "demo", Subject: "gina"}); o.Kind != sluice.Unavailable || o.Cause != sluice.FailedBeforeSend {
		t.Errorf("check against an untrusted certificate = %+v, want unavailable, failed before send", o)
	}
}

func TestServerNotRunning(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := newClient(t, "http://"+addr, sluiceclient.Options{})
	o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "hal"})
	if o.Kind != sluice.Unavailable || o.Cause != sluice.FailedBeforeSend || !errors.Is(o.Err, sluice.FailedBeforeSend) {
		t.Errorf("check against a closed port = %+v, want unavailable, failed before send", o)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if o := c.Check(ctx, sluice.Request{Policy: "demo", Subject: "hal"}); o.Kind != sluice.Unavailable || o.Cause != sluice.DeadlinePassed {
		t.Errorf("check with a canceled context = %+v, want unavailable, deadline passed", o)
	}
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		url  string
		opts sluiceclient.Options
	}{
		{"127.0.0.1:8080", sluiceclient.Options{}},
		{"ftp://127.0.0.1", sluiceclient.Options{}},
		{"http://127.0.0.1:8080", sluiceclient.Options{AttemptTimeout: -time.Second}},
		{"http://127.0.0.1:8080", sluiceclient.Options{Token: "two words"}},
	} {
		if _, err := sluiceclient.New(tc.url, tc.opts); err == nil {
			t.Errorf("New(%q, %+v) = nil error, want one", tc.url, tc.opts)
		}
	}
}

// Something other than the check API at the URL is the caller's mistake;
// a gateway's 502 may have lost sluice's answer and is retried.
func TestNotTheCheckAPI(t *testing.T) {
	var calls atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/gateway/v1/check" {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		http.NotFound(w, r)
	}))
	defer ts.Close()
	c := newClient(t, ts.URL+"/elsewhere", sluiceclient.Options{})
	if o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "ivy"}); o.Kind != sluice.Incompatible || calls.Load() != 1 {
		t.Errorf("a 404 page = %v (%v) after %d calls, want incompatible after 1", o.Kind, o.Err, calls.Load())
	}
	calls.Store(0)
	c = newClient(t, ts.URL+"/gateway", sluiceclient.Options{})
	if o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "ivy"}); o.Kind != sluice.Indeterminate || calls.Load() != 3 {
		t.Errorf("a gateway's 502 = %v (%v) after %d calls, want indeterminate after 3", o.Kind, o.Err, calls.Load())
	}
}

// TestLeases: an allowed check of a concurrency policy holds a lease;
// Release gives it back, also when its first answer is lost (a release
// is idempotent: it is simply sent again); a lease acquired with a rate
// policy is released by naming both.
func TestLeases(t *testing.T) {
	cs, _ := startServer(t, nil, server.Options{}, false)
	c := newClient(t, cs.url, sluiceclient.Options{})
	ctx := t.Context()
	req := sluice.Request{Policy: "reports", Subject: "carol"}
	a, b := c.Check(ctx, req), c.Check(ctx, req)
	if a.Kind != sluice.Allowed || a.Lease.ID == "" || b.Lease.ID == a.Lease.ID || a.Lease.Subject != "carol" || fmt.Sprint(a.Lease.Policies) != "[reports]" {
		t.Fatalf("two checks: %+v, %+v; want two distinct leases for carol on [reports]", a.Lease, b.Lease)
	}
	if o := c.Check(ctx, req); o.Kind != sluice.Denied || o.Lease.ID != "" {
		t.Fatalf("third at once = %+v, want denied without a lease", o)
	}
	cs.lose.Store(1)
	if o := c.Release(ctx, a.Lease); o.Kind != sluice.Allowed || o.Remaining != 1 {
		t.Fatalf("Release with its first answer lost = %+v (%v), want allowed, 1 remaining", o, o.Err)
	}
	if o := c.Release(ctx, sluice.Lease{}); o.Kind != sluice.Allowed {
		t.Fatalf("Release of the zero lease = %+v, want allowed", o)
	}
	if o := c.Renew(ctx, b.Lease); o.Kind != sluice.Allowed || o.Lease.ID != b.Lease.ID {
		t.Fatalf("Renew = %+v, want allowed, the same lease", o)
	}
	both := c.Check(ctx, sluice.Request{Policies: []string{"demo", "reports"}, Subject: "carol"})
	if both.Kind != sluice.Allowed || both.Lease.ID == "" {
		t.Fatalf("check of demo and reports = %+v, want allowed with a lease", both)
	}
	if o := c.Release(ctx, both.Lease); o.Kind != sluice.Allowed || len(o.Statuses) != 1 || o.Statuses[0].Remaining != 1 {
		t.Fatalf("Release naming demo and reports = %+v (%v), want allowed, reports' status only", o, o.Err)
	}
}

// openCircuit refuses every decision as a store whose breaker is open.
type openCircuit struct{}

func (openCircuit) Evaluate(context.Context, *sluice.Evaluation) error {
	return fmt.Errorf("test store: %w", sluice.CircuitOpen)
}

// TestUnavailableKeepsItsCause: the server's reason for not deciding
// reaches the caller as the Outcome's Cause.
func TestUnavailableKeepsItsCause(t *testing.T) {
	cs, _ := startServer(t, openCircuit{}, server.Options{}, false)
	c := newClient(t, cs.url, sluiceclient.Options{})
	o := c.Check(context.Background(), sluice.Request{Policy: "demo", Subject: "ivy"})
	if o.Kind != sluice.Unavailable || o.Cause != sluice.CircuitOpen {
		t.Fatalf("Check against an open circuit = %+v, want Unavailable, cause circuit_open", o)
	}
}

// TestReserve: Reserve books on the server: admitted now, then the slot
// an hour ahead (delay_ms, rounded up); cancel gives it back while it is
// ahead (the next booking gets the same slot), once; past MaxWait it is
// Denied, booking nothing; a lost answer is not resent (a book has no
// evaluation id to replay it by): Indeterminate after one request.
func TestReserve(t *testing.T) {
	cs, _ := startServer(t, nil, server.Options{}, false)
	c := newClient(t, cs.url, sluiceclient.Options{Retries: 3})
	ctx := t.Context()
	req := sluice.Request{Policy: "hourly", Subject: "w"}
	if o, _ := c.Reserve(ctx, req); o.Kind != sluice.Allowed || o.Delay != 0 {
		t.Fatalf("first Reserve = %+v, want admitted now", o)
	}
	ahead := func(o sluice.Outcome) bool {
		return o.Kind == sluice.Allowed && o.Delay > 59*time.Minute && o.Delay <= time.Hour
	}
	o, cancel := c.Reserve(ctx, req)
	if !ahead(o) {
		t.Fatalf("second Reserve = %+v, want the slot an hour ahead", o)
	}
	cancel()
	cancel()
	if o, _ := c.Reserve(ctx, req); !ahead(o) {
		t.Fatalf("Reserve after cancel = %+v, want the slot given back, an hour ahead", o)
	}
	if o, _ := c.Reserve(ctx, sluice.Request{Policy: "hourly", Subject: "w", MaxWait: time.Minute}); o.Kind != sluice.Denied || o.RetryAfter < time.Hour {
		t.Fatalf("Reserve with max wait 1m = %+v, want denied, retry after two hours", o)
	}
	if o, _ := c.Reserve(ctx, sluice.Request{Op: sluice.Refund, Policy: "hourly", Subject: "w"}); o.Kind != sluice.Incompatible {
		t.Fatalf("Reserve of a refund = %+v, want Incompatible", o)
	}
	cs.lose.Store(1)
	before := cs.requests.Load()
	if o, _ := c.Reserve(ctx, sluice.Request{Policy: "hourly", Subject: "lost"}); o.Kind != sluice.Indeterminate || cs.requests.Load() != before+1 {
		t.Fatalf("Reserve with its answer lost = %+v after %d requests, want Indeterminate after 1", o, cs.requests.Load()-before)
	}
}

// TestEvaluationIDOnlyWhenRetried: Check generates an evaluation id for
// a spend only when it may send it again; with Retries -1 the id could
// never be used, and the server would remember it for nothing.
func TestEvaluationIDOnlyWhenRetried(t *testing.T) {
	cs, _ := startServer(t, nil, server.Options{}, false)
	var mu sync.Mutex
	var ids []string
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			EvaluationID string `json:"evaluation_id"`
		}
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Errorf("body %s: %v", raw, err)
		}
		mu.Lock()
		ids = append(ids, body.EvaluationID)
		mu.Unlock()
		resp, err := http.Post(cs.url+r.URL.Path, "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Errorf("forward: %v", err)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(rec.Close)
	for _, retries := range []int{-1, 0} {
		c := newClient(t, rec.URL, sluiceclient.Options{Retries: retries})
		if o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "ids"}); o.Kind != sluice.Allowed {
			t.Fatalf("Retries %d: %v (%v), want allowed", retries, o.Kind, o.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 2 || ids[0] != "" || ids[1] == "" {
		t.Errorf("evaluation ids sent with Retries -1, then the default: %q; want none, then one", ids)
	}
}
