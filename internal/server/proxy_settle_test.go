package server_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
)

// TestProxySettle: a route with settle_header spends its estimate, and
// once the upstream's body is done settles it with the tokens the
// upstream reported, in a header or (streamed) a trailer; what settles
// did is on sluice_settled_units_total. Requests go one at a time over
// one connection: the proxy reads the next only once the previous one,
// its settle included, is done.
func TestProxySettle(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used := r.URL.Query().Get("tokens")
		if r.URL.Path == "/v1/stream" {
			w.Header().Set("Trailer", "X-Tokens-Used")
			io.WriteString(w, "data: a token at a time\n")
			w.(http.Flusher).Flush()
			w.Header().Set("X-Tokens-Used", used)
			return
		}
		w.Header().Set("X-Tokens-Used", used)
		io.WriteString(w, "done")
	}))
	t.Cleanup(up.Close)
	policies := []sluice.Policy{{ID: "tokens", Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Hour, DedupeTTL: time.Minute}}
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/v1"}, Policies: []string{"tokens"}, Subject: "header:X-Team", SettleHeader: "X-Tokens-Used", Estimate: 300},
	}}, nil, policies)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	t.Cleanup(client.CloseIdleConnections)
	for i, tc := range []struct {
		path      string
		tokens    int
		code      int
		remaining int // before the settle: the estimate spent
	}{
		{"/v1/complete", 100, 200, 700}, // 200 given back: 900
		{"/v1/stream", 500, 200, 600},   // 200 charged: 400
		{"/v1/complete", 700, 200, 100}, // 400 charged: 300 owed
		{"/v1/complete", 1, 429, 0},
	} {
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s%s?tokens=%d", f.url, tc.path, tc.tokens), nil)
		req.Header.Set("X-Team", "a")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"tokens";r=`+strconv.Itoa(tc.remaining)+`;`) {
			t.Fatalf("request %d (%s, %d tokens): %d %s, want %d with %d remaining", i, tc.path, tc.tokens, resp.StatusCode, resp.Header.Get("RateLimit"), tc.code, tc.remaining)
		}
	}
	got := scrape(t, f.metrics)
	for series, want := range map[string]float64{
		`sluice_settled_units_total{kind="charged",policy="tokens"}`:    600,
		`sluice_settled_units_total{kind="given_back",policy="tokens"}`: 200,
		`sluice_settled_units_total{kind="owed",policy="tokens"}`:       300,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}
