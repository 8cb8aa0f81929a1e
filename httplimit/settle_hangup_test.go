package httplimit_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// TestSettleHeaderHangUp: the cost is the one reported in the header the
// handler writes, whatever the client does after. The handler is an
// httputil.ReverseProxy to an upstream that reports X-Tokens-Used and
// then sends 200 KB; a client that reads 60 KB and hangs up makes the
// reverse proxy abort (panic(http.ErrAbortHandler)), and pays the
// reported 900 all the same, not the estimate of 100. A report above the
// store's most (1e9) is charged as the most, never left at the estimate.
// A cost in a trailer is read only when the body reaches its end.
// Everything goes over loopback sockets; the settle is awaited on the
// edge core's settle hook.
func TestSettleHeaderHangUp(t *testing.T) {
	release := make(chan struct{}) // closed as the test ends: no upstream call outlives it
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Has("trailer") {
			w.Header().Set("Trailer", "X-Tokens-Used")
			defer w.Header().Set("X-Tokens-Used", q.Get("tokens")) // after the body
		} else {
			w.Header().Set("X-Tokens-Used", q.Get("tokens"))
		}
		w.WriteHeader(http.StatusOK)
		chunk := strings.Repeat("t", 8<<10)
		for range 25 { // 200 KB
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
		if q.Has("hang") {
			select { // the body never ends before the client hangs up
			case <-r.Context().Done():
			case <-release:
			}
		}
	}))
	defer up.Close()
	defer close(release)
	upURL, _ := url.Parse(up.URL)
	rp := httputil.NewSingleHostReverseProxy(upURL)

	store, err := memstore.New(memstore.Options{Clock: sluicetest.NewClock(), SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	lim, err := sluice.New(store, []sluice.Policy{{ID: "tokens", Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Hour, DedupeTTL: time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	who, _ := subject.Header("X-Who")
	mw, err := httplimit.New(lim, httplimit.Options{Routes: []httplimit.Route{{Policies: []string{"tokens"}, Cost: 100, SettleHeader: "X-Tokens-Used", Subject: who}}})
	if err != nil {
		t.Fatal(err)
	}
	subjects := make(chan string, 1)
	settled := make(chan sluice.Outcome, 1)
	limited := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := httplimit.FromContext(r.Context())
		subjects <- d.Subject
		rp.ServeHTTP(w, r)
	}))
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hook := func(_, _ []string, o sluice.Outcome) { settled <- o }
		limited.ServeHTTP(w, r.WithContext(edge.WithSettled(r.Context(), hook)))
	}))
	defer front.Close()

	for _, tc := range []struct {
		name   string
		query  string
		hangUp bool
		left   int64 // of 1000, after the settle
	}{
		{"read in full", "tokens=900", false, 100},
		{"hung up", "tokens=900&hang", true, 100},
		{"above the most, read in full", "tokens=5000000000", false, 0},
		{"above the most, hung up", "tokens=5000000000&hang", true, 0},
		{"past int64, hung up", "tokens=99999999999999999999&hang", true, 0},
		{"trailer, read in full", "tokens=900&trailer", false, 100},
		// A trailer comes after the body: a client that hangs up before
		// it pays the estimate (docs/httplimit.md, docs/proxy.md).
		{"trailer, hung up", "tokens=900&trailer&hang", true, 900},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second)) // a bound, not a threshold
			io.WriteString(conn, "GET /v1/complete?"+tc.query+" HTTP/1.1\r\nHost: sluice.test\r\nX-Who: "+tc.name+"\r\nConnection: close\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.hangUp {
				if n, err := io.Copy(io.Discard, resp.Body); n != 200<<10 || err != nil {
					t.Fatalf("read %d bytes of the body, want 200 KB: %v", n, err)
				}
			} else if n, err := io.CopyN(io.Discard, resp.Body, 60<<10); err != nil {
				t.Fatalf("read %d bytes of the body, want 60 KB: %v", n, err)
			}
			conn.Close() // hung up, or done
			var o sluice.Outcome
			select {
			case o = <-settled:
			case <-time.After(30 * time.Second): // a bound, not a threshold
				t.Fatal("no settle within 30s")
			}
			if o.Kind != sluice.Allowed {
				t.Errorf("settle = %+v, want it taken", o)
			}
			peek := lim.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "tokens", Subject: <-subjects})
			if peek.Remaining != tc.left {
				t.Errorf("after %s: peek = %d left of 1000, want %d (settle %+v)", tc.query, peek.Remaining, tc.left, o)
			}
		})
	}
}
