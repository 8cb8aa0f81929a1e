package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestTokens runs the example's proxy in front of the fake model, both on
// loopback, on a fake clock: a call that used fewer tokens than the
// estimate gives the rest back, one that used more leaves the team in
// debt (429 until the rate has paid it off), and the team is admitted
// again once it has. Calls go one at a time over one connection: the
// server reads the next only after the previous handler, its settle
// included, has returned.
func TestTokens(t *testing.T) {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	upstream := httptest.NewServer(fakeUpstream())
	defer upstream.Close()
	proxy, err := newProxy(store, upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	call := func(team string, tokens int) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/v1/complete?tokens=%d", srv.URL, tokens), nil)
		req.Header.Set("X-Team", team)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("RateLimit")
	}
	for i, tc := range []struct {
		team    string
		tokens  int
		advance time.Duration
		code    int
		limit   string
	}{
		{"a", 100, 0, 200, `"tokens";r=700;t=18`},  // 300 estimated of 1000; 200 given back after
		{"a", 1200, 0, 200, `"tokens";r=600;t=24`}, // 900 left, 300 estimated; 900 charged after: 300 owed
		{"a", 50, 0, 429, `"tokens";r=0;t=78`},     // the debt: 1300 tokens to refill at 1000 a minute
		{"b", 50, 0, 200, `"tokens";r=700;t=18`},   // another team's budget
		{"a", 50, 35 * time.Second, 429, `"tokens";r=283;t=43`},
		{"a", 50, time.Second, 200, `"tokens";r=0;t=60`}, // 300 refilled past the debt: the estimate fits
	} {
		clock.Advance(tc.advance)
		if code, limit := call(tc.team, tc.tokens); code != tc.code || limit != tc.limit {
			t.Fatalf("call %d (team %s, %d tokens) = %d %s, want %d %s", i, tc.team, tc.tokens, code, limit, tc.code, tc.limit)
		}
	}
}

// TestTry runs the command as `go run ./examples/llmtokens -try` does.
func TestTry(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-try"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out.String(), ": 429 "); got != 2 || !strings.Contains(out.String(), "asked  100 tokens: 200") {
		t.Fatalf("-try printed\n%s\nwant two calls admitted, then two limited by the second call's debt", out.String())
	}
}
