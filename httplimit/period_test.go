package httplimit_test

import (
	"net/http"
	"net/http/httptest"
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
