package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

func TestDemo(t *testing.T) {
	store, err := memstore.New(memstore.Options{Clock: sluicetest.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	h, err := newHandler(store, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	get := func(path, acct string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if acct != "" {
			req.Header.Set("X-Account", acct)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	var got []int
	for range 4 {
		got = append(got, get("/demo", "alice").StatusCode)
	}
	if want := []int{200, 200, 200, 429}; !equal(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	resp := get("/demo?account=alice", "")
	if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != 429 || err != nil || n < 1 {
		t.Errorf("query-param account: %d Retry-After %q, want 429 with Retry-After >= 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := get("/demo", "bob").StatusCode; got != 200 {
		t.Errorf("bob: %d, want 200", got)
	}
	if got := get("/demo", "").StatusCode; got != 403 {
		t.Errorf("no account: %d, want 403", got)
	}
}

func TestRunTry(t *testing.T) {
	var out, errs bytes.Buffer
	if err := run(context.Background(), []string{"-try"}, &out, &errs); err != nil {
		t.Fatalf("run -try: %v (stderr %s)", err, errs.String())
	}
	for _, want := range []string{"request 1: 200 OK", "request 3: 200 OK", "request 4: 429 Too Many Requests", "Retry-After: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q: want %q", out.String(), want)
		}
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
