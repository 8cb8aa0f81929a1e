package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// leaseServer serves next behind a middleware limiting every request to
// "1 at once" (a lease that lives an hour, so only a release frees it
// within a test) on a real loopback socket, and reports on returned each
// time the middleware has finished with a request, its release included.
func leaseServer(t *testing.T, store sluice.Store, next http.Handler) (srv *httptest.Server, returned chan struct{}) {
	t.Helper()
	l, err := sluice.New(store, []sluice.Policy{{ID: "one", Algorithm: sluice.Concurrency, Limit: 1, LeaseTTL: time.Hour},
		{ID: "rate", Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Hour}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Every test server has its own pseudonym key: the same loopback
	// client is another subject on each, whatever store they share.
	pseudo, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte(fmt.Sprintf("lease-test-%d-0123456789abcdef", rand.Uint64()))}})
	if err != nil {
		t.Fatal(err)
	}
	m := newMiddleware(t, l, httplimit.Options{Default: []string{"rate", "one"}, Pseudonymizer: pseudo, Deadline: 5 * time.Second})
	returned = make(chan struct{}, 10)
	h := m.Handler(next)
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { returned <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, returned
}

// TestLeaseMiddleware runs the lease scenarios of the middleware over real
// sockets on memstore, a standalone Redis and a 3-master Redis Cluster.
func TestLeaseMiddleware(t *testing.T) {
	scenarios := []struct {
		name string
		run  func(*testing.T, sluice.Store)
	}{
		{"ReleasedWhenHandlerReturns", testLeaseReleasedWhenHandlerReturns},
		{"ReleasedOnPanic", testLeaseReleasedOnPanic},
		{"ReleasedOnClientDisconnect", testLeaseReleasedOnClientDisconnect},
		{"RefundLeavesTheLease", testRefundLeavesTheLease},
	}
	stores := []struct {
		name  string
		store func(t *testing.T) sluice.Store
	}{
		{"memstore", func(t *testing.T) sluice.Store { return newMemStore(t, sluicetest.NewClock()) }},
		{"redis", func(t *testing.T) sluice.Store {
			c := redistest.Standalone(t).Client()
			t.Cleanup(func() { c.Close() })
			return newRedisStore(t, c)
		}},
		{"cluster", func(t *testing.T) sluice.Store {
			c := redistest.Cluster(t).Client()
			t.Cleanup(func() { c.Close() })
			return newRedisStore(t, c)
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			store := st.store(t)
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) { sc.run(t, store) })
			}
		})
	}
}

func newRedisStore(t *testing.T, c redis.UniversalClient) sluice.Store {
	t.Helper()
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testLeaseReleasedWhenHandlerReturns: while one request is in the
// handler a second is refused; once it returns, a third goes through.
func testLeaseReleasedWhenHandlerReturns(t *testing.T, store sluice.Store) {
	entered, proceed := make(chan httplimit.Decision), make(chan struct{})
	srv, returned := leaseServer(t, store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			d, _ := httplimit.FromContext(r.Context())
			entered <- d
			<-proceed
		}
		w.Write([]byte("ok"))
	}))
	slow := make(chan int)
	go func() {
		resp, err := srv.Client().Get(srv.URL + "/slow")
		if err != nil {
			t.Errorf("GET /slow: %v", err)
			slow <- 0
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	d := <-entered
	if d.Outcome.Lease.ID == "" || len(d.Outcome.Lease.Policies) != 1 || d.Outcome.Lease.Policies[0] != "one" {
		t.Fatalf("decision in the handler = %+v, want a lease on [one]", d.Outcome)
	}
	if status, _, h := get(t, srv, "/"); status != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("second request while one is in flight = %d, want 429 with Retry-After", status)
	}
	<-returned // the refused one
	close(proceed)
	if status := <-slow; status != http.StatusOK {
		t.Fatalf("slow request = %d, want 200", status)
	}
	<-returned
	if status, _, _ := get(t, srv, "/"); status != http.StatusOK {
		t.Fatalf("request after the first returned = %d, want 200 (lease released)", status)
	}
}

// testLeaseReleasedOnPanic: a handler that panics still gives its slot back.
func testLeaseReleasedOnPanic(t *testing.T, store sluice.Store) {
	srv, returned := leaseServer(t, store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic(http.ErrAbortHandler) // net/http's own abort: a real panic, not logged
		}
		w.Write([]byte("ok"))
	}))
	if _, err := srv.Client().Get(srv.URL + "/panic"); err == nil {
		t.Fatal("GET /panic: no error, want the connection aborted by the panic")
	}
	<-returned
	if status, _, _ := get(t, srv, "/"); status != http.StatusOK {
		t.Fatalf("request after a handler panicked = %d, want 200 (lease released)", status)
	}
}

// testLeaseReleasedOnClientDisconnect: a client that hangs up mid-request
// cancels the request's context; the handler returns and the slot is
// given back, although the context the release could have used is done.
func testLeaseReleasedOnClientDisconnect(t *testing.T, store sluice.Store) {
	entered := make(chan struct{})
	srv, returned := leaseServer(t, store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hang" {
			close(entered)
			<-r.Context().Done() // the client went away
			return
		}
		w.Write([]byte("ok"))
	}))
	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/hang", nil)
		_, err := srv.Client().Do(req)
		failed <- err
	}()
	<-entered
	cancel() // closes the connection
	if err := <-failed; !errors.Is(err, context.Canceled) {
		t.Fatalf("hung-up request: %v, want context.Canceled", err)
	}
	<-returned
	if status, _, _ := get(t, srv, "/"); status != http.StatusOK {
		t.Fatalf("request after a client hung up = %d, want 200 (lease released)", status)
	}
}

// testRefundLeavesTheLease: Refund gives back a route's rate units, not
// its lease, which goes when the handler returns.
func testRefundLeavesTheLease(t *testing.T, store sluice.Store) {
	var refunded sluice.Outcome
	srv, returned := leaseServer(t, store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refunded = httplimit.Refund(r.Context())
		w.Write([]byte("ok"))
	}))
	if status, _, _ := get(t, srv, "/"); status != http.StatusOK {
		t.Fatalf("request = %d, want 200", status)
	}
	<-returned
	if refunded.Kind != sluice.Allowed || refunded.Remaining != 100 || len(refunded.Statuses) != 0 && refunded.Policy != "rate" {
		t.Fatalf("Refund = %+v (err %v), want allowed, rate back to 100", refunded, refunded.Err)
	}
	if status, _, _ := get(t, srv, "/"); status != http.StatusOK {
		t.Fatalf("second request = %d, want 200", status)
	}
}
