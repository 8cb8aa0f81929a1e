package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/sluicetest"
)

// leaseServer serves next behind a middleware limiting every request to
// "1 at once" (a lease that lives an hour, so only a release frees it
// within a test) on a real loopback socket, and reports on returned each
// time the middleware has finished with a request, its release included.
func leaseServer(t *testing.T, next http.Handler) (srv *httptest.Server, returned chan struct{}) {
	t.Helper()
	clock := sluicetest.NewClock(sluicetest.Start)
	l := newLimiter(t, clock, sluice.Policy{ID: "one", Algorithm: sluice.Concurrency, Limit: 1, LeaseTTL: time.Hour},
		sluice.Policy{ID: "rate", Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Hour})
	m := newMiddleware(t, l, httplimit.Options{Default: []string{"rate", "one"}})
	returned = make(chan struct{}, 10)
	h := m.Handler(next)
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { returned <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, returned
}

// TestLeaseReleasedWhenHandlerReturns: while one request is in the
// handler a second is refused; once it returns, a third goes through.
func TestLeaseReleasedWhenHandlerReturns(t *testing.T) {
	entered, proceed := make(chan httplimit.Decision), make(chan struct{})
	srv, returned := leaseServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// TestLeaseReleasedOnPanic: a handler that panics still gives its slot back.
func TestLeaseReleasedOnPanic(t *testing.T) {
	srv, returned := leaseServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// TestLeaseReleasedOnClientDisconnect: a client that hangs up mid-request
// cancels the request's context; the handler returns and the slot is
// given back, although the context the release could have used is done.
func TestLeaseReleasedOnClientDisconnect(t *testing.T) {
	entered := make(chan struct{})
	srv, returned := leaseServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// TestRefundLeavesTheLease: Refund gives back a route's rate units, not
// its lease, which goes when the handler returns.
func TestRefundLeavesTheLease(t *testing.T) {
	var refunded sluice.Outcome
	srv, returned := leaseServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
