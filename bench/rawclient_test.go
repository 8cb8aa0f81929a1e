package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRawDecide holds rawDecide's reading of answers to net/http's: the
// request the server sees, 200 an admission, 429 a denial, another
// status an error, and the connection kept for the next check.
func TestRawDecide(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Policy, Subject string }
		if r.Method != http.MethodPost || r.URL.Path != "/v1/check" || r.Header.Get("Content-Type") != "application/json" ||
			json.NewDecoder(r.Body).Decode(&in) != nil || in.Policy != "open" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Filler", strings.Repeat("f", 100))
		switch in.Subject {
		case "denied":
			w.WriteHeader(http.StatusTooManyRequests)
		case "broken":
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write([]byte(`{"allowed":true}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	decide, release := rawDecide(srv.URL, "open", []string{"allowed", "denied", "broken"}, 1)
	defer release()
	for round := range 3 {
		for i, want := range []int{1, 0} {
			if got, err := decide(context.Background(), i); err != nil || got != want {
				t.Fatalf("round %d, subject %d: %d, %v; want %d, nil", round, i, got, err, want)
			}
		}
	}
	if _, err := decide(context.Background(), 2); err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Errorf("a 503: %v, want an error naming status 503", err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the six checks before the 503 took %d connections, want 1", n)
	}
}

// TestRawDecideNoLength holds an answer without Content-Length to an
// error, not a read to the connection's end.
func TestRawDecideNoLength(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		c.Read(buf)
		c.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
		c.Read(buf) // until the client closes
	}()
	decide, release := rawDecide("http://"+ln.Addr().String(), "open", []string{"a"}, 1)
	defer release()
	if _, err := decide(context.Background(), 0); err == nil || !strings.Contains(err.Error(), "without Content-Length") {
		t.Errorf("an answer without Content-Length: %v, want that error", err)
	}
}
