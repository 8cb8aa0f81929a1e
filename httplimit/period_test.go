package httplimit_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// TestPeriodHeadersPointAtThePeriodsEnd: a monthly plan in Europe/Berlin
// answers, an hour before April begins there, a Retry-After and a
// RateLimit reset of exactly that hour, and RateLimit-Policy without a
// window (a month has no fixed length); on the 1st the month starts
// afresh and resets in April's 30 days.
func TestPeriodHeadersPointAtThePeriodsEnd(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	clock := sluicetest.NewClock()
	clock.Set(time.Date(2026, 3, 31, 23, 0, 0, 0, berlin))
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "plan", Algorithm: sluice.FixedWindow, Limit: 2, Period: "month", TimeZone: berlin},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	limit, err := httplimit.New(limiter, httplimit.Options{
		Routes: []httplimit.Route{{PathPrefix: "/", Policies: []string{"plan"}}},
		Subject: subject.Principal(func(r *http.Request) (string, bool) {
			return "acme", true
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(srv.Close)
	get := func() *http.Response {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	type answer struct {
		status                        int
		policy, ratelimit, retryAfter string
	}
	for i, want := range []answer{
		{200, `"plan";q=2`, `"plan";r=1;t=3600`, ""},
		{200, `"plan";q=2`, `"plan";r=0;t=3600`, ""},
		{429, `"plan";q=2`, `"plan";r=0;t=3600`, "3600"},
	} {
		resp := get()
		got := answer{resp.StatusCode, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After")}
		if got != want {
			t.Fatalf("request %d at 23:00 on 31 March in Berlin = %+v, want %+v", i+1, got, want)
		}
	}
	clock.Set(time.Date(2026, 4, 1, 0, 0, 0, 0, berlin))
	if resp := get(); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != `"plan";r=1;t=2592000` {
		t.Fatalf("on 1 April = %d %q, want 200 and a reset in 30 days", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
}

// TestProblemDatesALongWait: a monthly plan's 429 says when to come back
// as a date (RFC 3339, UTC) when that is more than an hour away, not as
// millions of seconds; within the hour it says the seconds. Retry-After
// stays in seconds either way. The date is read on the edge's clock (the
// real one), so it is bounded by the instants before and after the request.
func TestProblemDatesALongWait(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	clock := sluicetest.NewClock()
	clock.Set(time.Date(2026, 3, 10, 12, 0, 0, 0, berlin))
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "plan", Algorithm: sluice.FixedWindow, Limit: 1, Period: "month", TimeZone: berlin},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	limit, err := httplimit.New(limiter, httplimit.Options{
		Routes:  []httplimit.Route{{PathPrefix: "/", Policies: []string{"plan"}}},
		Subject: subject.Principal(func(r *http.Request) (string, bool) { return "acme", true }),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(srv.Close)
	get := func() (retryAfter, detail string) {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p struct {
			Detail string `json:"detail"`
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Fatal(err)
			}
		}
		return resp.Header.Get("Retry-After"), p.Detail
	}
	if ra, _ := get(); ra != "" {
		t.Fatalf("first request: Retry-After %q, want admitted", ra)
	}

	// 10 March 12:00 in Berlin: April begins in 21 days and 11 hours.
	before := time.Now()
	ra, detail := get()
	after := time.Now()
	const wait = (21*24 + 11) * time.Hour
	if ra != strconv.Itoa(int(wait/time.Second)) {
		t.Fatalf("Retry-After = %q, want %d: seconds, whatever the detail says", ra, wait/time.Second)
	}
	date, ok := strings.CutPrefix(detail, "Too many requests; retry after ")
	date, ok2 := strings.CutSuffix(date, ".")
	at, err := time.Parse(time.RFC3339, date)
	if !ok || !ok2 || err != nil || !strings.HasSuffix(date, "Z") {
		t.Fatalf("detail = %q, want %q and an RFC 3339 date in UTC (%v)", detail, "Too many requests; retry after <date>.", err)
	}
	if lo, hi := before.Add(wait).Truncate(time.Second), after.Add(wait+time.Second); at.Before(lo) || at.After(hi) {
		t.Errorf("detail = %q: %v, want between %v and %v (now + Retry-After)", detail, at, lo.UTC(), hi.UTC())
	}

	// An hour before April: the seconds.
	clock.Set(time.Date(2026, 3, 31, 23, 0, 0, 0, berlin))
	if ra, detail := get(); ra != "3600" || detail != "Too many requests; retry in 3600 s." {
		t.Errorf("an hour before April: Retry-After %q, detail %q, want 3600 and %q", ra, detail, "Too many requests; retry in 3600 s.")
	}
}
