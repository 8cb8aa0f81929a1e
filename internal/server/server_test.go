package server_test

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
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/sfparse"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// answer is the JSON of POST /v1/check, decoded strictly so that a field
// the contract does not name fails the test.
type answer struct {
	Outcome      string   `json:"outcome"`
	Allowed      bool     `json:"allowed"`
	Limit        int64    `json:"limit"`
	Remaining    int64    `json:"remaining"`
	ResetAfterMS int64    `json:"reset_after_ms"`
	RetryAfterMS int64    `json:"retry_after_ms"`
	Approximate  bool     `json:"approximate"`
	Reason       string   `json:"reason"`
	Cause        string   `json:"cause"`
	Replayed     *bool    `json:"replayed"` // a pointer, to see that it is always there
	Statuses     []status `json:"statuses"`
	LeaseID      string   `json:"lease_id"`
	Charged      int64    `json:"charged"`
	GivenBack    int64    `json:"given_back"`
	Owed         int64    `json:"owed"`
	DelayMS      int64    `json:"delay_ms"`
}

type status struct {
	Policy       string `json:"policy"`
	Outcome      string `json:"outcome"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Approximate  bool   `json:"approximate"`
	Reason       string `json:"reason"`
	Charged      int64  `json:"charged"`
	GivenBack    int64  `json:"given_back"`
	Owed         int64  `json:"owed"`
	DelayMS      int64  `json:"delay_ms"`
}

// sfItem and sfParam are what the RateLimit fields parse into.
type (
	sfItem  = sfparse.Member
	sfParam = sfparse.Param
)

// mustParseList parses the one field line of name in h as an RFC 9651
// List with at least one member, as the draft requires.
func mustParseList(t *testing.T, h http.Header, name string) []sfItem {
	t.Helper()
	lines := h.Values(name)
	if len(lines) != 1 {
		t.Fatalf("%s: %d field lines %q, want 1", name, len(lines), lines)
	}
	items, err := sfparse.ParseList(lines[0])
	if err != nil || len(items) == 0 {
		t.Fatalf("%s: %q: %v, want a non-empty list", name, lines[0], err)
	}
	return items
}

// param returns the value of the parameter key of it, nil when absent.
func param(it sfItem, key string) any {
	v, _ := it.Param(key)
	return v
}

// fixture is a server on a real loopback socket over memstore and a fake
// clock, logging at debug level into logs.
type fixture struct {
	url   string
	clock *sluicetest.Clock
	pseud *subject.Pseudonymizer
	store *recordingStore
	logs  *syncBuffer
}

var demoPolicies = []sluice.Policy{
	{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
	{ID: "login", Algorithm: sluice.SlidingLog, Limit: 5, Window: time.Minute},
	{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 20},
	{ID: "tiny", Algorithm: sluice.FixedWindow, Limit: 1, Window: 1500 * time.Microsecond},
}

func newFixture(t *testing.T, policies []sluice.Policy, opts server.Options) *fixture {
	t.Helper()
	clock := sluicetest.NewClock()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	return newFixtureOn(t, &recordingStore{Store: ms}, clock, policies, opts)
}

func newFixtureOn(t *testing.T, store *recordingStore, clock *sluicetest.Clock, policies []sluice.Policy, opts server.Options) *fixture {
	t.Helper()
	lim, err := sluice.New(store, policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pseud, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts.Clock = clock
	srv, err := server.New(lim, pseud, log, opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(validating(t, srv))
	t.Cleanup(ts.Close)
	return &fixture{url: ts.URL, clock: clock, pseud: pseud, store: store, logs: logs}
}

// post sends body to /v1/check and decodes the answer strictly.
func (f *fixture) post(t *testing.T, body string) (*http.Response, answer) {
	t.Helper()
	return f.postTo(t, "/v1/check", body)
}

// postTo sends body to path and decodes the answer strictly.
func (f *fixture) postTo(t *testing.T, path, body string) (*http.Response, answer) {
	t.Helper()
	resp, err := http.Post(f.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var a answer
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		t.Fatalf("POST /v1/check %s: body %q: %v", body, raw, err)
	}
	if a.Replayed == nil {
		t.Fatalf("POST /v1/check %s: body %q has no replayed field", body, raw)
	}
	replayed := *a.Replayed
	a.Replayed = nil
	if replayed {
		a.Replayed = &replayed // only a true value stays, so tests compare answers without it
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("POST /v1/check %s: Content-Type = %q, want application/json", body, ct)
	}
	return resp, a
}

// TestFixedWindowFourChecks is the "done when": 3 per 10s answers
// 200, 200, 200, 429 for one subject, with honest headers.
func TestFixedWindowFourChecks(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	const body = `{"policy":"demo","subject":"alice"}`
	wantCodes := []int{200, 200, 200, 429}
	for i, wantCode := range wantCodes {
		resp, a := f.post(t, body)
		if resp.StatusCode != wantCode {
			t.Fatalf("check #%d: status %d, want %d (answer %+v)", i+1, resp.StatusCode, wantCode, a)
		}
		wantRemaining := int64(max(0, 2-i))
		want := answer{Outcome: "allowed", Allowed: true, Limit: 3, Remaining: wantRemaining, ResetAfterMS: 10000}
		if wantCode == 429 {
			want = answer{Outcome: "denied", Limit: 3, Remaining: 0, ResetAfterMS: 10000, RetryAfterMS: 10000}
		}
		if diff := cmp.Diff(want, a); diff != "" {
			t.Errorf("check #%d: answer mismatch (-want +got):\n%s", i+1, diff)
		}
		wantPolicy := []sfItem{{Value: "demo", Params: []sfParam{{Key: "q", Value: int64(3)}, {Key: "w", Value: int64(10)}}}}
		if diff := cmp.Diff(wantPolicy, mustParseList(t, resp.Header, "RateLimit-Policy")); diff != "" {
			t.Errorf("check #%d: RateLimit-Policy mismatch (-want +got):\n%s", i+1, diff)
		}
		wantLimit := []sfItem{{Value: "demo", Params: []sfParam{{Key: "r", Value: wantRemaining}, {Key: "t", Value: int64(10)}}}}
		if diff := cmp.Diff(wantLimit, mustParseList(t, resp.Header, "RateLimit")); diff != "" {
			t.Errorf("check #%d: RateLimit mismatch (-want +got):\n%s", i+1, diff)
		}
		retry := resp.Header.Get("Retry-After")
		if wantCode == 200 && retry != "" {
			t.Errorf("check #%d: allowed answer has Retry-After %q", i+1, retry)
		}
		if wantCode == 429 {
			if n, err := strconv.Atoi(retry); err != nil || n < 1 || n != 10 {
				t.Errorf("check #%d: Retry-After = %q, want 10", i+1, retry)
			}
		}
	}
	// Another subject has its own budget.
	if resp, _ := f.post(t, `{"policy":"demo","subject":"bob"}`); resp.StatusCode != 200 {
		t.Errorf("bob's first check: status %d, want 200", resp.StatusCode)
	}
}

func TestRetryAfterFollowsTheClock(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	const body = `{"policy":"demo","subject":"alice"}`
	f.post(t, body)
	f.clock.Advance(2500 * time.Millisecond)
	f.post(t, body)
	f.post(t, body)
	resp, a := f.post(t, body)
	if resp.StatusCode != 429 || a.RetryAfterMS != 7500 || a.ResetAfterMS != 7500 {
		t.Fatalf("fourth check 2.5s into the window: %d %+v, want 429 with retry_after_ms 7500", resp.StatusCode, a)
	}
	if got := resp.Header.Get("Retry-After"); got != "8" {
		t.Errorf("Retry-After = %q, want 8 (7.5s rounded up)", got)
	}
	if got := param(mustParseList(t, resp.Header, "RateLimit")[0], "t"); got != int64(8) {
		t.Errorf("RateLimit t = %v, want 8 (7.5s rounded up)", got)
	}
	f.clock.Advance(7500 * time.Millisecond)
	if resp, a := f.post(t, body); resp.StatusCode != 200 || a.Remaining != 2 {
		t.Errorf("first check of the next window: %d %+v, want 200 with remaining 2", resp.StatusCode, a)
	}
}

func TestDurationsRoundUp(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	const body = `{"policy":"tiny","subject":"alice"}`
	if resp, a := f.post(t, body); resp.StatusCode != 200 || a.ResetAfterMS != 2 {
		t.Fatalf("first check of 1 per 1.5ms: %d %+v, want 200 with reset_after_ms 2", resp.StatusCode, a)
	}
	f.clock.Advance(time.Millisecond)
	resp, a := f.post(t, body)
	if resp.StatusCode != 429 || a.RetryAfterMS != 1 || a.ResetAfterMS != 1 {
		t.Fatalf("second check 1ms later: %d %+v, want 429 with retry_after_ms 1 (0.5ms rounded up)", resp.StatusCode, a)
	}
	if got := resp.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1 (at least one second)", got)
	}
	wantPolicy := []sfItem{{Value: "tiny", Params: []sfParam{{Key: "q", Value: int64(1)}}}}
	if diff := cmp.Diff(wantPolicy, mustParseList(t, resp.Header, "RateLimit-Policy")); diff != "" {
		t.Errorf("RateLimit-Policy of a sub-second window leaves out w (-want +got):\n%s", diff)
	}
}

func TestPeekSpendsNothing(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	for i := 0; i < 2; i++ {
		f.post(t, `{"policy":"demo","subject":"alice","cost":1}`)
	}
	for i := 0; i < 3; i++ {
		resp, a := f.post(t, `{"policy":"demo","subject":"alice","cost":0}`)
		if resp.StatusCode != 200 || a.Remaining != 1 {
			t.Fatalf("peek #%d after 2 of 3: %d %+v, want 200 with remaining 1", i+1, resp.StatusCode, a)
		}
	}
	if resp, _ := f.post(t, `{"policy":"demo","subject":"alice"}`); resp.StatusCode != 200 {
		t.Fatalf("third real check after peeks: status %d, want 200", resp.StatusCode)
	}
	resp, a := f.post(t, `{"policy":"demo","subject":"alice","cost":0}`)
	if resp.StatusCode != 429 || a.Outcome != "denied" || a.Remaining != 0 {
		t.Errorf("peek at an exhausted window: %d %+v, want 429 denied", resp.StatusCode, a)
	}
}

func TestCostAboveOne(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	if resp, a := f.post(t, `{"policy":"demo","subject":"alice","cost":2}`); resp.StatusCode != 200 || a.Remaining != 1 {
		t.Fatalf("cost 2 of 3: %d %+v, want 200 with remaining 1", resp.StatusCode, a)
	}
	if resp, a := f.post(t, `{"policy":"demo","subject":"alice","cost":2}`); resp.StatusCode != 429 || a.Remaining != 1 {
		t.Fatalf("cost 2 with 1 left: %d %+v, want 429 with remaining 1", resp.StatusCode, a)
	}
}

func TestErrorStatuses(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{MaxBodyBytes: 1500})
	big := `{"policy":"demo","subject":"` + strings.Repeat("a", 2000) + `"}`
	for _, tc := range []struct {
		name, body string
		code       int
		reason     string // a substring of the reason
	}{
		{"unknown policy", `{"policy":"nope","subject":"alice"}`, 404, `policy "nope": unknown policy`},
		{"unknown policy among several", `{"policies":["demo","nope"],"subject":"alice"}`, 404, "unknown policy"},
		{"cost above max_cost", `{"policy":"demo","subject":"alice","cost":4}`, 422, "cost above policy maximum 3"},
		{"negative cost", `{"policy":"demo","subject":"alice","cost":-1}`, 400, "cost = -1: must not be negative"},
		{"malformed JSON", `{"policy":"demo","subject":`, 400, "malformed JSON"},
		{"not JSON", `policy=demo&subject=alice`, 400, "malformed JSON"},
		{"unknown field", `{"policy":"demo","subject":"alice","weight":2}`, 400, `unknown field "weight"`},
		{"two values", `{"policy":"demo","subject":"alice"} {}`, 400, "more than one value"},
		{"fractional cost", `{"policy":"demo","subject":"alice","cost":1.5}`, 400, "malformed JSON"},
		{"cost as string", `{"policy":"demo","subject":"alice","cost":"1"}`, 400, "malformed JSON"},
		{"missing subject", `{"policy":"demo"}`, 400, "subject is required"},
		{"empty subject", `{"policy":"demo","subject":""}`, 400, "subject is required"},
		{"null", `null`, 400, "subject is required"},
		{"empty body", ``, 400, "request body is empty"},
		{"body too large", big, 400, "larger than 1500 bytes"},
		{"subject too long", `{"policy":"demo","subject":"` + strings.Repeat("a", 1025) + `"}`, 400, "subject is 1025 bytes"},
		{"no policy", `{"subject":"alice"}`, 400, "policy is required"},
		{"policy and policies", `{"policy":"demo","policies":["login"],"subject":"alice"}`, 400, "not both"},
		{"policy named twice", `{"policies":["demo","demo"],"subject":"alice"}`, 400, "named twice"},
		{"bad evaluation id", `{"policy":"demo","subject":"alice","evaluation_id":"a b"}`, 400, "evaluation id byte 1"},
		{"evaluation id too long", `{"policy":"demo","subject":"alice","evaluation_id":"` + strings.Repeat("e", 129) + `"}`, 400, "evaluation id is 129 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.check(t, tc.body, tc.code, tc.reason)
		})
	}
	// Nothing above spent anything.
	if resp, a := f.post(t, `{"policy":"demo","subject":"alice"}`); resp.StatusCode != 200 || a.Remaining != 2 {
		t.Errorf("first valid check after the errors: %d %+v, want 200 with remaining 2", resp.StatusCode, a)
	}
}

func (f *fixture) check(t *testing.T, body string, code int, reason string) {
	t.Helper()
	resp, a := f.post(t, body)
	if resp.StatusCode != code {
		t.Errorf("POST %.60s: status %d, want %d (answer %+v)", body, resp.StatusCode, code, a)
	}
	if a.Outcome != "incompatible" || a.Allowed || !strings.Contains(a.Reason, reason) {
		t.Errorf("POST %.60s: answer %+v, want outcome incompatible with a reason containing %q", body, a, reason)
	}
	for _, h := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("POST %.60s: %d answer has %s: %s", body, code, h, v)
		}
	}
}

func TestSeveralPolicies(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	const body = `{"policies":["login","demo"],"subject":"alice"}`
	for i := 0; i < 3; i++ {
		resp, a := f.post(t, body)
		if resp.StatusCode != 200 || len(a.Statuses) != 2 {
			t.Fatalf("check #%d: %d %+v, want 200 with two statuses", i+1, resp.StatusCode, a)
		}
		// demo (3 per 10s) is the most restrictive and speaks for the whole.
		if a.Limit != 3 || a.Remaining != int64(2-i) {
			t.Errorf("check #%d: top-level %+v, want demo's numbers", i+1, a)
		}
	}
	resp, a := f.post(t, body)
	want := answer{
		Outcome: "denied", Limit: 3, ResetAfterMS: 10000, RetryAfterMS: 10000,
		Statuses: []status{
			{Policy: "login", Outcome: "allowed", Allowed: true, Limit: 5, Remaining: 2, ResetAfterMS: 60000},
			{Policy: "demo", Outcome: "denied", Limit: 3, Remaining: 0, ResetAfterMS: 10000, RetryAfterMS: 10000},
		},
	}
	if resp.StatusCode != 429 || len(a.Statuses) != 2 {
		t.Fatalf("fourth check: status %d %+v, want 429 with two statuses", resp.StatusCode, a)
	}
	if diff := cmp.Diff(want, a); diff != "" {
		t.Errorf("fourth check: answer mismatch (-want +got):\n%s", diff)
	}
	wantPolicy := []sfItem{
		{Value: "login", Params: []sfParam{{Key: "q", Value: int64(5)}, {Key: "w", Value: int64(60)}}},
		{Value: "demo", Params: []sfParam{{Key: "q", Value: int64(3)}, {Key: "w", Value: int64(10)}}},
	}
	if diff := cmp.Diff(wantPolicy, mustParseList(t, resp.Header, "RateLimit-Policy")); diff != "" {
		t.Errorf("RateLimit-Policy mismatch (-want +got):\n%s", diff)
	}
	// RateLimit names the denying policy first (ratelimitheader.AppendLimitField).
	wantLimit := []sfItem{
		{Value: "demo", Params: []sfParam{{Key: "r", Value: int64(0)}, {Key: "t", Value: int64(10)}}},
		{Value: "login", Params: []sfParam{{Key: "r", Value: int64(2)}, {Key: "t", Value: int64(60)}}},
	}
	if diff := cmp.Diff(wantLimit, mustParseList(t, resp.Header, "RateLimit")); diff != "" {
		t.Errorf("RateLimit mismatch (-want +got):\n%s", diff)
	}
	// All or nothing: the denied check spent nothing on login either.
	if _, a := f.post(t, `{"policy":"login","subject":"alice","cost":0}`); a.Remaining != 2 {
		t.Errorf("login after the denied multi-check: remaining %d, want 2", a.Remaining)
	}
}

func TestStoreFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		code    int
		outcome string
		retry   string
	}{
		{"failed before send", fmt.Errorf("test: dial: %w", sluice.FailedBeforeSend), 503, "unavailable", "1"},
		{"reply lost", fmt.Errorf("test: read: %w", sluice.ErrIndeterminate), 503, "indeterminate", "1"},
		{"circuit open", sluice.CircuitOpen, 503, "unavailable", "1"},
		{"corrupt state", fmt.Errorf("test: %w", sluice.CorruptState), 503, "unavailable", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := sluicetest.NewClock()
			f := newFixtureOn(t, &recordingStore{Store: failingStore{tc.err}}, clock, demoPolicies, server.Options{})
			resp, a := f.post(t, `{"policy":"demo","subject":"alice"}`)
			if resp.StatusCode != tc.code || a.Outcome != tc.outcome || a.Allowed || a.Reason == "" {
				t.Errorf("status %d %+v, want %d with outcome %s and a reason", resp.StatusCode, a, tc.code, tc.outcome)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.retry {
				t.Errorf("Retry-After = %q, want %q", got, tc.retry)
			}
			if got := resp.Header.Get("RateLimit"); got != "" {
				t.Errorf("a %d answer has RateLimit: %s", tc.code, got)
			}
		})
	}
}

// TestSubjectIsPseudonymized checks that the raw subject reaches neither
// the store nor the log.
func TestSubjectIsPseudonymized(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	const raw = "alice@example.com"
	for i := 0; i < 4; i++ {
		f.post(t, `{"policy":"demo","subject":"`+raw+`","evaluation_id":"req-`+strconv.Itoa(i)+`"}`)
	}
	f.post(t, `{"policy":"nope","subject":"`+raw+`"}`)
	f.post(t, `{"policy":"demo","subject":"`+raw+`","cost":-1}`)
	want := f.pseud.Pseudonym("api", raw, "")
	subjects := f.store.subjects()
	if len(subjects) != 4 {
		t.Fatalf("store saw %d evaluations, want 4", len(subjects))
	}
	for _, s := range subjects {
		if s != want {
			t.Errorf("store saw subject %q, want the pseudonym %q", s, want)
		}
	}
	logs := f.logs.String()
	if strings.Contains(logs, "alice") {
		t.Errorf("the log holds the raw subject:\n%s", logs)
	}
	if !strings.Contains(logs, want) || !strings.Contains(logs, "status=429") {
		t.Errorf("the log lacks the pseudonym or the 429:\n%s", logs)
	}
}

// TestHealthAndReadiness: /healthz is liveness; /readyz/store is the
// store's health; /readyz is ready while the store is, and also while it
// is not but a policy is answered without it (failure_mode open or
// local, local quota), so a Service keeps the pods answering those.
func TestHealthAndReadiness(t *testing.T) {
	var mu sync.Mutex
	var storeErr error
	ready := func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return storeErr
	}
	withQuota := append(slices.Clone(demoPolicies), sluice.Policy{ID: "quota", Algorithm: sluice.FixedWindow, Limit: 1000, Window: time.Second, LocalQuota: sluice.LocalQuota{Enabled: true}})
	for _, tc := range []struct {
		name     string
		policies []sluice.Policy
		modes    map[string]failure.Mode
		readyz   int // while the store fails
		names    string
	}{
		{"every policy fails closed", demoPolicies, nil, 503, ""},
		{"one fails open", demoPolicies, map[string]failure.Mode{"api": failure.Open}, 200, "api"},
		{"one falls back locally", demoPolicies, map[string]failure.Mode{"login": failure.Local}, 200, "login"},
		{"one has local quota", withQuota, nil, 200, "quota"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			storeErr = nil
			mu.Unlock()
			f := newFixture(t, tc.policies, server.Options{Ready: []server.Check{ready}, FailureModes: tc.modes})
			get := func(path string) (int, string) {
				t.Helper()
				resp, err := http.Get(f.url + path)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			for _, path := range []string{"/healthz", "/readyz", "/readyz/store"} {
				if code, body := get(path); code != 200 || body != "ok\n" {
					t.Errorf("GET %s = %d %q, want 200 ok", path, code, body)
				}
			}
			mu.Lock()
			storeErr = errors.New("redis: connection refused")
			mu.Unlock()
			if code, body := get("/readyz/store"); code != 503 || !strings.Contains(body, "connection refused") {
				t.Errorf("GET /readyz/store with a failing store = %d %q, want 503 naming the failure", code, body)
			}
			code, body := get("/readyz")
			if code != tc.readyz || !strings.Contains(body, "connection refused") || !strings.Contains(body, tc.names) {
				t.Errorf("GET /readyz with a failing store = %d %q, want %d naming the failure and %q", code, body, tc.readyz, tc.names)
			}
			if code, _ := get("/healthz"); code != 200 {
				t.Errorf("GET /healthz with a failing store = %d, want 200", code)
			}
			if code, _ := get("/v2/check"); code != 404 {
				t.Errorf("GET /v2/check = %d, want 404", code)
			}
		})
	}
}

func TestMethodNotAllowed(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/v1/check", "POST"},
		{"PUT", "/v1/check", "POST"},
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/readyz", "GET, HEAD"},
	} {
		req, err := http.NewRequest(tc.method, f.url+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s = %d Allow %q, want 405 Allow %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
		}
	}
}

func TestNewRejectsMissingParts(t *testing.T) {
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	lim, err := sluice.New(ms, demoPolicies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name  string
		lim   *sluice.Limiter
		pseud *subject.Pseudonymizer
		log   *slog.Logger
		opts  server.Options
	}{
		{"no pseudonymizer", lim, nil, log, server.Options{}},
		{"no logger", lim, subject.Unkeyed(), nil, server.Options{}},
		{"negative body cap", lim, subject.Unkeyed(), log, server.Options{MaxBodyBytes: -1}},
		{"nil readiness check", lim, subject.Unkeyed(), log, server.Options{Ready: []server.Check{nil}}},
	} {
		if srv, err := server.New(tc.lim, tc.pseud, tc.log, tc.opts); err == nil {
			t.Errorf("New(%s) = %v, nil; want an error", tc.name, srv)
		}
	}
}

// recordingStore remembers the subjects it was asked about.
type recordingStore struct {
	sluice.Store
	mu   sync.Mutex
	seen []string
}

func (s *recordingStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	s.mu.Lock()
	s.seen = append(s.seen, ev.Subject)
	s.mu.Unlock()
	return s.Store.Evaluate(ctx, ev)
}

func (s *recordingStore) subjects() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// failingStore fails every evaluation with err, as a broken backend would.
type failingStore struct{ err error }

func (s failingStore) Evaluate(context.Context, *sluice.Evaluation) error { return s.err }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestEvaluationIDReplays checks that a retry with the same evaluation_id
// gets the first answer without spending again, marked replayed.
func TestEvaluationIDReplays(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	const body = `{"policy":"demo","subject":"alice","evaluation_id":"order-42"}`
	for i := 0; i < 3; i++ {
		resp, a := f.post(t, body)
		if resp.StatusCode != 200 || a.Remaining != 2 {
			t.Fatalf("check #%d with evaluation_id order-42: %d %+v, want 200 with remaining 2", i+1, resp.StatusCode, a)
		}
		if got, want := a.Replayed != nil, i > 0; got != want {
			t.Errorf("check #%d with evaluation_id order-42: replayed = %v, want %v", i+1, got, want)
		}
	}
	if !strings.Contains(f.logs.String(), "replayed=true") {
		t.Errorf("the log does not mark the replays:\n%s", f.logs.String())
	}
	if resp, a := f.post(t, `{"policy":"demo","subject":"alice"}`); resp.StatusCode != 200 || a.Remaining != 1 {
		t.Errorf("check without an id after the replays: %d %+v, want 200 with remaining 1", resp.StatusCode, a)
	}
}

func TestRefund(t *testing.T) {
	policies := append(append([]sluice.Policy(nil), demoPolicies...),
		sluice.Policy{ID: "broad", Algorithm: sluice.SlidingWindow, Limit: 100, Window: time.Minute})
	f := newFixture(t, policies, server.Options{})
	for i := 0; i < 3; i++ {
		f.post(t, `{"policy":"demo","subject":"alice"}`)
	}
	if resp, _ := f.post(t, `{"policy":"demo","subject":"alice"}`); resp.StatusCode != 429 {
		t.Fatalf("fourth check: status %d, want 429", resp.StatusCode)
	}
	resp, a := f.post(t, `{"policy":"demo","subject":"alice","refund":true,"cost":2}`)
	if resp.StatusCode != 200 || a.Outcome != "allowed" || a.Remaining != 2 {
		t.Fatalf("refund of 2: %d %+v, want 200 allowed with remaining 2", resp.StatusCode, a)
	}
	for i, want := range []int{200, 200, 429} {
		if resp, _ := f.post(t, `{"policy":"demo","subject":"alice"}`); resp.StatusCode != want {
			t.Fatalf("check #%d after the refund: status %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	// A refund never raises remaining above the limit.
	if _, a := f.post(t, `{"policy":"demo","subject":"bob","refund":true,"cost":3}`); a.Remaining != 3 {
		t.Errorf("refund to an untouched subject: remaining %d, want 3", a.Remaining)
	}
	// sliding_window units cannot be given back exactly: 422 with the reason.
	f.check(t, `{"policy":"broad","subject":"alice","refund":true}`, 422, "refund not supported")
	f.check(t, `{"policies":["demo","broad"],"subject":"alice","refund":true}`, 422, "refund not supported")
	// A refund of nothing is a peek and a refund at once.
	f.check(t, `{"policy":"demo","subject":"alice","refund":true,"cost":0}`, 400, "a refund gives back a cost of 1 or more")
	f.check(t, `{"policy":"demo","subject":"alice","refund":"yes"}`, 400, "malformed JSON")
	if !strings.Contains(f.logs.String(), "refund=true") {
		t.Errorf("the log does not mark the refund:\n%s", f.logs.String())
	}
}

// TestStalledBodyNamesNoAddress: a client that stops sending its body
// mid-way is answered, and neither the answer nor the log names an
// address (a network error's text carries both ends').
func TestStalledBodyNamesNoAddress(t *testing.T) {
	lim, err := sluice.New(memstoreFor(t), demoPolicies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	srv, err := server.New(lim, subject.Unkeyed(), slog.New(slog.NewTextHandler(logs, nil)), server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(srv)
	ts.Config.ReadTimeout = 300 * time.Millisecond
	ts.Start()
	defer ts.Close()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"policy":"demo",`
	fmt.Fprintf(conn, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n%s", body)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, _ := io.ReadAll(conn)
	answer := string(raw)
	if !strings.Contains(answer, "could not be read") {
		t.Fatalf("answer to a stalled body = %q, want one saying the body could not be read", answer)
	}
	for what, text := range map[string]string{"answer": answer, "log": logs.String()} {
		if strings.Contains(text, "127.0.0.1:") {
			t.Errorf("the %s names an address:\n%s", what, text)
		}
	}
}

func memstoreFor(t testing.TB) sluice.Store {
	t.Helper()
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	return ms
}

// TestOutageLogsAreThrottled: a store that fails every request is logged a
// few lines a second with the count held back, not one line per request.
func TestOutageLogsAreThrottled(t *testing.T) {
	clock := sluicetest.NewClock()
	f := newFixtureOn(t, &recordingStore{Store: failingStore{fmt.Errorf("test: %w", sluice.FailedBeforeSend)}}, clock, demoPolicies, server.Options{})
	const n = 100
	for range n {
		f.post(t, `{"policy":"demo","subject":"alice"}`)
	}
	clock.Advance(time.Second)
	f.post(t, `{"policy":"demo","subject":"alice"}`)
	logs := f.logs.String()
	if lines := strings.Count(logs, "level=WARN"); lines != 11 || !strings.Contains(logs, "suppressed_since_last=90") {
		t.Fatalf("%d failing requests in one second, then one more a second later, wrote %d WARN lines: want 10, then one counting the 90 held back\n%s", n, lines, logs)
	}
}

// TestClientErrorLogsAreThrottled: a client repeating a mistake (a
// misspelled policy, a missing token) writes at most ten 4xx lines a
// second, the first after a pause counting those held back, as store
// failures do.
func TestClientErrorLogsAreThrottled(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	const n = 100
	for range n {
		f.post(t, `{"policy":"dmeo","subject":"alice"}`)
	}
	f.clock.Advance(time.Second)
	f.post(t, `{"policy":"demo","subject":""}`)
	logs := f.logs.String()
	if lines := strings.Count(logs, "level=INFO"); lines != 11 || !strings.Contains(logs, "suppressed_since_last=90") ||
		strings.Count(logs, "status=404") != 10 || strings.Count(logs, "status=400") != 1 {
		t.Fatalf("%d requests naming an unknown policy in one second, then a malformed one a second later, wrote %d INFO lines: want 10 (404), then one (400) counting the 90 held back\n%s", n, lines, logs)
	}
}

// hungStore never decides: it waits for the caller to give up, as a
// store in front of a Redis that accepts and never answers.
type hungStore struct{}

func (hungStore) Evaluate(ctx context.Context, _ *sluice.Evaluation) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestDecisionTimeout: a check, a release or a renewal waits for the store
// no longer than DecisionTimeout, then answers 503, unavailable.
func TestDecisionTimeout(t *testing.T) {
	policies := append([]sluice.Policy{{ID: "slots", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: time.Minute}}, demoPolicies...)
	lim, err := sluice.New(hungStore{}, policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pseud := subject.Unkeyed()
	srv, err := server.New(lim, pseud, slog.New(slog.DiscardHandler), server.Options{DecisionTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(validating(t, srv))
	defer ts.Close()
	// The client's own timeout only keeps a broken server from hanging the
	// test; the server must answer long before it.
	client := &http.Client{Timeout: time.Minute}
	for path, body := range map[string]string{
		"/v1/check":   `{"policy":"demo","subject":"alice"}`,
		"/v1/release": `{"policy":"slots","subject":"alice","lease_id":"q3Xh0bV8Yx2lC0mQe1o7bA"}`,
		"/v1/renew":   `{"policy":"slots","subject":"alice","lease_id":"q3Xh0bV8Yx2lC0mQe1o7bA"}`,
	} {
		resp, err := client.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s against a hung store: %v", path, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(string(raw), `"outcome":"unavailable"`) || !strings.Contains(string(raw), `"cause":"deadline_passed"`) {
			t.Fatalf("POST %s: answer = %d %s, want 503 unavailable, cause deadline_passed", path, resp.StatusCode, raw)
		}
	}
	if _, err := server.New(lim, pseud, slog.New(slog.DiscardHandler), server.Options{DecisionTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "DecisionTimeout = -1s") {
		t.Errorf("New with a negative DecisionTimeout: error = %v, want one naming it", err)
	}
}

// TestLimitIsOneNumber holds the JSON's limit, RateLimit-Policy's q and
// the most remaining ever shows to one number for every algorithm (what
// ratelimitheader's doc states): the bucket for token_bucket and gcra,
// the limit otherwise, with w such that q per w is the rate.
func TestLimitIsOneNumber(t *testing.T) {
	for _, tc := range []struct {
		p     sluice.Policy
		q     int64
		w     any // nil: absent
		first int64
	}{
		{sluice.Policy{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Window: 10 * time.Second}, 10, int64(10), 9},
		{sluice.Policy{ID: "sl", Algorithm: sluice.SlidingLog, Limit: 10, Window: 10 * time.Second}, 10, int64(10), 9},
		{sluice.Policy{ID: "sw", Algorithm: sluice.SlidingWindow, Limit: 10, Window: 10 * time.Second}, 10, int64(10), 9},
		{sluice.Policy{ID: "tb", Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Second, Burst: 20}, 20, int64(2), 19},
		{sluice.Policy{ID: "gcra", Algorithm: sluice.GCRA, Limit: 10, Window: time.Second, Burst: 5}, 5, nil, 4},
		{sluice.Policy{ID: "gcra-hour", Algorithm: sluice.GCRA, Limit: 60, Window: time.Minute, Burst: 120}, 120, int64(120), 119},
		{sluice.Policy{ID: "conc", Algorithm: sluice.Concurrency, Limit: 3, LeaseTTL: time.Minute}, 3, nil, 2},
	} {
		t.Run(tc.p.ID, func(t *testing.T) {
			f := newFixture(t, []sluice.Policy{tc.p}, server.Options{})
			resp, a := f.post(t, `{"policy":"`+tc.p.ID+`","subject":"alice"}`)
			if resp.StatusCode != 200 {
				t.Fatalf("check: status %d, answer %+v", resp.StatusCode, a)
			}
			var params []sfParam
			params = append(params, sfParam{Key: "q", Value: tc.q})
			if tc.w != nil {
				params = append(params, sfParam{Key: "w", Value: tc.w})
			}
			if diff := cmp.Diff([]sfItem{{Value: tc.p.ID, Params: params}}, mustParseList(t, resp.Header, "RateLimit-Policy")); diff != "" {
				t.Errorf("RateLimit-Policy mismatch (-want +got):\n%s", diff)
			}
			if a.Limit != tc.q || a.Remaining != tc.first {
				t.Errorf("JSON limit %d, remaining %d; want limit %d (= q), remaining %d", a.Limit, a.Remaining, tc.q, tc.first)
			}
			if r := param(mustParseList(t, resp.Header, "RateLimit")[0], "r"); r != a.Remaining {
				t.Errorf("RateLimit r = %v, JSON remaining %d: want the same", r, a.Remaining)
			}
		})
	}
}
