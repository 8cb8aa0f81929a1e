package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// abuseSettleConfig is a proxy in front of an upstream that reports its
// cost in X-Tokens-Used: one route and one policy (2000 tokens an hour,
// an estimate of 100) per scenario, so that each settle shows on a
// series of its own.
const abuseSettleConfig = `
server: { listen: "127.0.0.1:0" }
%s
policies:
  - { id: full, algorithm: token_bucket, limit: 2000, window: 1h, dedupe_ttl: 1m }
  - { id: hangup, algorithm: token_bucket, limit: 2000, window: 1h, dedupe_ttl: 1m }
  - { id: most, algorithm: token_bucket, limit: 2000, window: 1h, dedupe_ttl: 1m }
  - { id: mosthangup, algorithm: token_bucket, limit: 2000, window: 1h, dedupe_ttl: 1m }
proxy:
  listen: "127.0.0.1:0"
  upstream: "%s"
  routes:
    - { match: { path_prefix: /full/ }, policies: [full], subject: "header:X-Team", estimate: 100, settle_header: X-Tokens-Used }
    - { match: { path_prefix: /hangup/ }, policies: [hangup], subject: "header:X-Team", estimate: 100, settle_header: X-Tokens-Used }
    - { match: { path_prefix: /most/ }, policies: [most], subject: "header:X-Team", estimate: 100, settle_header: X-Tokens-Used }
    - { match: { path_prefix: /mosthangup/ }, policies: [mosthangup], subject: "header:X-Team", estimate: 100, settle_header: X-Tokens-Used }
`

// TestAbuseSettleHeader plays a hostile client of a settle_header route
// under sluice serve (issue 46, point 3), on memstore and Redis: the
// upstream reports X-Tokens-Used in its header, then sends 200 KB; a
// client that reads 60 KB and hangs up makes the reverse proxy abort, and
// used to pay only the estimate (100 of the reported 900). A report above
// the store's most (1e9) was refused by the store and also left only the
// estimate. The bound: what the upstream reports in its header is charged
// whatever the client does after, and a report past the most charges the
// most, never less than the estimate.
func TestAbuseSettleHeader(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testAbuseSettleHeader(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testAbuseSettleHeader(t, fmt.Sprintf(`store: { type: redis, redis: { url: "redis://%s/0" } }`, srv.Addr))
	})
}

func testAbuseSettleHeader(t *testing.T, store string) {
	release := make(chan struct{}) // closed as the test ends: no upstream call outlives it
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Tokens-Used", r.URL.Query().Get("tokens"))
		w.WriteHeader(http.StatusOK)
		chunk := strings.Repeat("t", 8<<10)
		for range 25 { // 200 KB
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
		if r.URL.Query().Has("hang") {
			select { // the body never ends before the client hangs up
			case <-r.Context().Done():
			case <-release:
			}
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, abuseSettleConfig, store, up.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startRun(t, path, "")
	m := proxyListening.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", s.logs)
	}
	proxy := strings.TrimPrefix(m[1], "http://")
	for _, tc := range []struct {
		policy  string
		tokens  string
		hangUp  bool // after 60 KB of the body, else read to its end
		charged string
		probe   string // the status and RateLimit of the next request (its estimate spent)
	}{
		{"full", "900", false, "800", `200 "full";r=1000;`},
		{"hangup", "900", true, "800", `200 "hangup";r=1000;`},
		{"most", "5000000000", false, "", `429 "most";r=0;`},
		{"mosthangup", "99999999999999999999", true, "", `429 "mosthangup";r=0;`},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			series := fmt.Sprintf(`sluice_settled_units_total{kind="charged",policy=%q}`, tc.policy)
			notSettled := strings.Count(s.logs.String(), "estimate not settled")
			query := "?tokens=" + tc.tokens
			if tc.hangUp {
				query += "&hang"
			}
			if code, _ := proxyGet(t, proxy, "/"+tc.policy+"/v1"+query, tc.hangUp); code != http.StatusOK {
				t.Fatalf("request = %d, want 200", code)
			}
			// The settle is done once it is counted, or logged as not taken.
			var got string
			waitUntil(t, "the settle of "+tc.policy, func() bool {
				got = metricValue(t, s, series)
				return got != "" || strings.Count(s.logs.String(), "estimate not settled") > notSettled
			})
			if tc.charged != "" && got != tc.charged {
				t.Errorf("%s = %q, want %s: the reported 900 less the estimate 100", series, got, tc.charged)
			}
			if tc.charged == "" {
				if n, err := strconv.Atoi(got); err != nil || n < 1900 {
					t.Errorf("%s = %q, want at least 1900: a report past the most charges the whole budget", series, got)
				}
			}
			if code, rl := proxyGet(t, proxy, "/"+tc.policy+"/v1?tokens=0", false); !strings.HasPrefix(fmt.Sprintf("%d %s", code, rl), tc.probe) {
				t.Errorf("next request = %d %s, want %s...", code, rl, tc.probe)
			}
		})
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
}

// proxyGet sends GET path to the proxy at addr as team "acme" over a
// connection of its own, reads the body to its end, or 60 KB of it when
// hangUp (an answer of 200), and hangs up; it returns the status and the
// RateLimit field.
func proxyGet(t *testing.T, addr, path string, hangUp bool) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second)) // a bound, not a threshold
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: sluice.test\r\nX-Team: acme\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if hangUp && resp.StatusCode == http.StatusOK {
		if n, err := io.CopyN(io.Discard, resp.Body, 60<<10); err != nil {
			t.Fatalf("GET %s: read %d bytes of the body, want 60 KB: %v", path, n, err)
		}
	} else if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("GET %s: reading the body: %v", path, err)
	}
	return resp.StatusCode, resp.Header.Get("RateLimit")
}
