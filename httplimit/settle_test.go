package httplimit_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// TestSettleHeader: a route with a SettleHeader spends its Cost as an
// estimate and settles it with what the handler reports, in a header or
// a trailer; a handler that reports nothing, or panics, settles at the
// estimate. Each request goes over one connection after the previous one
// has returned, settle included.
func TestSettleHeader(t *testing.T) {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	lim, err := sluice.New(store, []sluice.Policy{{ID: "p", Algorithm: sluice.GCRA, Limit: 100, Window: time.Hour, DedupeTTL: time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	who, _ := subject.Header("X-Who")
	mw, err := httplimit.New(lim, httplimit.Options{Routes: []httplimit.Route{{Policies: []string{"p"}, Cost: 10, SettleHeader: "x-used", Subject: who}}})
	if err != nil {
		t.Fatal(err)
	}
	subjects := make(chan string, 10)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := httplimit.FromContext(r.Context())
		subjects <- d.Subject
		switch r.URL.Path {
		case "/header":
			w.Header().Set("X-Used", "4")
		case "/trailer":
			w.Header().Set("Trailer", "X-Used")
			io.WriteString(w, "body first")
			w.Header().Set("X-Used", "30")
		case "/bad":
			w.Header().Set("X-Used", "-3")
		case "/panic":
			panic(http.ErrAbortHandler)
		}
	})))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	left := 100
	for _, tc := range []struct {
		path string
		used int
	}{{"/header", 4}, {"/trailer", 30}, {"/bad", 10}, {"/none", 10}, {"/panic", 10}} {
		req, _ := http.NewRequest("POST", srv.URL+tc.path, nil) // POST: a broken connection is not retried
		req.Header.Set("X-Who", "alice")
		if resp, err := client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		} else if tc.path != "/panic" {
			t.Fatal(err)
		}
		left -= tc.used
		if tc.path == "/panic" {
			// The aborted connection is the event: the handler, its
			// settle included, is done once the client sees it closed;
			// a new connection's request is read after.
			client.CloseIdleConnections()
		}
		o := lim.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "p", Subject: <-subjects})
		if o.Remaining != int64(left) {
			t.Fatalf("after %s (used %d): peek = %+v, want %d left", tc.path, tc.used, o, left)
		}
	}
}

// TestSettleHeaderRefused: a SettleHeader that is no header name, or on
// a route naming a concurrency policy or a sliding_window one, is refused
// by New.
func TestSettleHeaderRefused(t *testing.T) {
	store, _ := memstore.New(memstore.Options{SweepInterval: -1})
	defer store.Close()
	lim, err := sluice.New(store, []sluice.Policy{
		{ID: "c", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: time.Minute},
		{ID: "p", Algorithm: sluice.GCRA, Limit: 100, Window: time.Hour},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rt   httplimit.Route
		want string
	}{
		{httplimit.Route{Policies: []string{"p"}, SettleHeader: "x used"}, "Routes[0].SettleHeader"},
		{httplimit.Route{Policies: []string{"p", "c"}, SettleHeader: "X-Used"}, "concurrency"},
	} {
		if _, err := httplimit.New(lim, httplimit.Options{Routes: []httplimit.Route{tc.rt}}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.rt, err, tc.want)
		}
	}
}
