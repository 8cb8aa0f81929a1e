package httplimit_test

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// Three requests per 10 s per account on /demo: the fourth is answered 429
// with Retry-After. The fake clock makes the numbers exact; a real
// application leaves Clock unset.
func Example() {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
	}, sluice.Options{})
	if err != nil {
		log.Fatal(err)
	}

	limit, err := httplimit.New(limiter, httplimit.Options{
		Routes: []httplimit.Route{{PathPrefix: "/demo", Policies: []string{"demo"}}},
		// A real application returns the principal its authentication
		// established; this example trusts a header.
		Subject: subject.Principal(func(r *http.Request) (string, bool) {
			account := r.Header.Get("X-Account")
			return account, account != ""
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /demo", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	srv := httptest.NewServer(limit.Handler(mux))
	defer srv.Close()

	for range 4 {
		req, _ := http.NewRequest("GET", srv.URL+"/demo", nil)
		req.Header.Set("X-Account", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"))
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			fmt.Println("Retry-After:", ra, resp.Header.Get("Content-Type"))
		}
	}
	// Output:
	// 200 "demo";q=3;w=10 "demo";r=2;t=10
	// 200 "demo";q=3;w=10 "demo";r=1;t=10
	// 200 "demo";q=3;w=10 "demo";r=0;t=10
	// 429 "demo";q=3;w=10 "demo";r=0;t=10
	// Retry-After: 10 application/problem+json
}

// Behind a load balancer at 10.0.0.0/8, requests are limited by their API
// key, and those without one by the client address the balancer vouches
// for. A shared store (Redis) decides normally; when it cannot, the
// requests are decided (FailureMode FailLocal) by an in-process store
// holding a share of each limit: with four instances, a quarter each.
func Example_localFallback() {
	shared, err := memstore.New(memstore.Options{}) // in production, e.g. a redisstore.Store
	if err != nil {
		log.Fatal(err)
	}
	defer shared.Close()
	limiter, err := sluice.New(shared, []sluice.Policy{
		{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second},
	}, sluice.Options{})
	if err != nil {
		log.Fatal(err)
	}
	local, err := memstore.New(memstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer local.Close()
	pseudonyms, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte("load me from a secret store!")}})
	if err != nil {
		log.Fatal(err)
	}
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	apiKey, err := subject.Header("X-API-Key")
	if err != nil {
		log.Fatal(err)
	}
	m, err := httplimit.New(limiter, httplimit.Options{
		Default:       []string{"api"},
		Subject:       subject.FirstOf(apiKey, subject.ClientIP(ips)),
		Pseudonymizer: pseudonyms,
		FailureMode:   failure.Local,
		Fallback:      local,
		LocalShare:    0.25,
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := httplimit.FromContext(r.Context())
		fmt.Println(d.Action, "by", d.SubjectKind)
	})))
	defer srv.Close()
	for _, key := range []string{"sk_1", ""} {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	// Output:
	// admitted by api_key
	// admitted by ip
}

// The common case: each client address may send 3 requests per minute to
// /api/. Over Redis, only the store line changes:
// redisstore.New(rdb, redisstore.Options{}).
func ExamplePerIP() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	perIP, err := httplimit.PerIP(store, sluice.Policy{ID: "api", Algorithm: sluice.SlidingLog, Limit: 3, Window: time.Minute}, httplimit.Options{})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", perIP.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })))

	srv := httptest.NewServer(mux) // http.ListenAndServe(":8080", mux) in an application
	defer srv.Close()
	for range 4 {
		resp, err := srv.Client().Get(srv.URL + "/api/items")
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "api";q=3;w=60
	// 200 "api";q=3;w=60
	// 200 "api";q=3;w=60
	// 429 "api";q=3;w=60
}

// The handler finds the middleware's decision in its request's context,
// and gives the units back when the work it was admitted for failed before
// it was done. Options.Deny replaces the built-in 429 answer.
func ExampleRefund() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "export", Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Hour},
	}, sluice.Options{})
	if err != nil {
		log.Fatal(err)
	}
	m, err := httplimit.New(limiter, httplimit.Options{
		Routes: []httplimit.Route{{PathPrefix: "/export", Policies: []string{"export"}, Cost: 5}},
		Deny: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := httplimit.FromContext(r.Context())
			w.WriteHeader(d.Status)
			fmt.Fprintf(w, "no more exports for %v", d.Outcome.RetryAfter.Round(time.Minute))
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	export := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := httplimit.FromContext(r.Context())
		if r.URL.Query().Get("format") == "xls" { // fails before any work
			o := httplimit.Refund(r.Context())
			http.Error(w, fmt.Sprintf("unsupported format; %d of %d units left", o.Remaining, o.Limit), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "exported; %d units left", d.Outcome.Remaining)
	})
	srv := httptest.NewServer(m.Handler(export))
	defer srv.Close()

	for _, q := range []string{"?format=xls", "?format=csv", "?format=csv", "?format=csv"} {
		resp, err := srv.Client().Get(srv.URL + "/export" + q)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s\n", resp.StatusCode, bytes.TrimSpace(body))
	}
	// Output:
	// 400 unsupported format; 10 of 10 units left
	// 200 exported; 5 units left
	// 200 exported; 0 units left
	// 429 no more exports for 30m0s
}
