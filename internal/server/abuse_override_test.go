package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// The override operation's caller model (docs/security.md, "override"):
// a token of the admin scope may give one subject of one policy other
// numbers. Whatever it sends, a plan names exactly the subject its edge
// decides (or is refused), keeps its policy's kind, and no identifier
// it names reaches a log line or an answer.

// abuseOverrideConfig: two proxy routes that name their operation (so
// the budgets are not keyed by the match), one by address and one by
// API key with a config-file plan, and Envoy rules with an in-flight
// limit.
func abuseOverrideConfig(store, upstream string) string {
	return strings.Replace(overridesConfig(store), `  - { id: conc, algorithm: concurrency, limit: 2, lease_ttl: 30s }`, `  - { id: conc, algorithm: concurrency, limit: 2, lease_ttl: 30s }
  - { id: login, algorithm: fixed_window, limit: 6, window: 1h }`, 1) + `  - { proxy: { route: 1, header: cfg-key-5521 }, limit: 3, note: from the config }
proxy:
  listen: "127.0.0.1:0"
  upstream: "` + upstream + `"
  routes:
    - { match: { path_prefix: /a }, policies: [login], subject: ip, operation: sign-in }
    - { match: { path_prefix: /b }, policies: [login], subject: "header:X-API-Key", operation: keyed }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
`
}

// abuseEnv is one running server of abuseOverrideConfig.
type abuseEnv struct {
	s     *running
	proxy string
	envoy rlspb.RateLimitServiceClient
}

// admitted sends n GETs of path through the proxy from the loopback
// address from, with X-API-Key key (none when ""), and counts the 200s.
func (e *abuseEnv) admitted(t *testing.T, n int, from, path, key string) int {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	ok := 0
	for range n {
		req, err := http.NewRequest("GET", e.proxy+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			ok++
		}
	}
	return ok
}

// put sends an override PUT and returns its status and body.
func (e *abuseEnv) put(t *testing.T, body string) (int, string) {
	t.Helper()
	return call(t, "PUT", e.s.url+"/v1/overrides", ovrAdminToken, body)
}

// refused asserts that PUT body is answered 422 naming want, and that
// neither the answer nor the server's log carries raw.
func (e *abuseEnv) refused(t *testing.T, body, want, raw string) {
	t.Helper()
	code, out := e.put(t, body)
	if code != http.StatusUnprocessableEntity || !strings.Contains(out, want) || strings.Contains(out, raw) {
		t.Errorf("PUT %s = %d %s, want 422 naming %q without %q", body, code, out, want, raw)
	}
	if l := logLinesWith(e.s.logs.String(), raw); l != "" {
		t.Errorf("the server's log carries %q after PUT %s:\n%s", raw, body, l)
	}
}

// logLinesWith returns the lines of logs that hold raw.
func logLinesWith(logs, raw string) string {
	var out []string
	for l := range strings.Lines(logs) {
		if strings.Contains(l, raw) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// validateErr writes the config with the override rows extra added and
// returns what sluice validate reports ("" when it finds nothing).
func (e *abuseEnv) validateErr(t *testing.T, extra string) string {
	t.Helper()
	dir := t.TempDir()
	// The extra rows end the overrides list, which proxy: follows.
	cfg := strings.Replace(abuseOverrideConfig("", "http://127.0.0.1:1"), "proxy:\n", extra+"proxy:\n", 1)
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg, "rules/shop.yaml": envoyOverrideRules})
	_, err := server.Validate(filepath.Join(dir, "sluice.yaml"), func(k string) string { return overrideEnv[k] }, false)
	if err == nil {
		return ""
	}
	return err.Error()
}

// inFlight asks for a stream of tenant with request id id; limit, when
// set, is the descriptor's limit override. It returns the overall code,
// or the error.
func (e *abuseEnv) inFlight(t *testing.T, tenant, id string, limit *commonpb.RateLimitDescriptor_RateLimitOverride) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := e.envoy.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{{
		Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}, {Key: "request_id", Value: id}},
		Limit:   limit,
	}}})
	if err != nil {
		return "", err
	}
	return resp.OverallCode.String(), nil
}

var abuseOverrideRows = []struct {
	name string
	play func(t *testing.T, e *abuseEnv)
}{
	{"a plan for a proxy route with operation applies", func(t *testing.T, e *abuseEnv) {
		if code, out := e.put(t, `{"proxy":{"route":0,"ip":"127.0.0.5"},"limit":2,"note":"slowed"}`); code != 200 {
			t.Fatalf("PUT a plan of 2 for 127.0.0.5 on route 0 = %d %s", code, out)
		}
		if n := e.admitted(t, 6, "127.0.0.5", "/a", ""); n != 2 {
			t.Errorf("127.0.0.5 on a route with operation: %d of 6 admitted, want its plan's 2", n)
		}
		if n := e.admitted(t, 8, "127.0.0.6", "/a", ""); n != 6 {
			t.Errorf("127.0.0.6, without a plan: %d of 8 admitted, want the policy's 6", n)
		}
	}},
	{"a config-file plan for a proxy route with operation applies", func(t *testing.T, e *abuseEnv) {
		if n := e.admitted(t, 6, "127.0.0.7", "/b", "cfg-key-5521"); n != 3 {
			t.Errorf("key cfg-key-5521 under the config file's plan of 3: %d of 6 admitted, want 3", n)
		}
	}},
	{"a header value the proxy refuses cannot be planned", func(t *testing.T, e *abuseEnv) {
		e.refused(t, `{"proxy":{"route":1,"header":"list-a-8812,list-b-8812"},"limit":50}`, "proxy.header", "list-a-8812")
		e.refused(t, `{"proxy":{"route":1,"header":" padded-8813"},"limit":50}`, "proxy.header", "padded-8813")
		// The proxy answers that client 400: the plan could never apply.
		req, _ := http.NewRequest("GET", e.proxy+"/b", nil)
		req.Header.Set("X-API-Key", "list-a-8812,list-b-8812")
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 400 {
			t.Errorf("the proxy with a listed key = %v %v, want 400", resp, err)
		} else {
			resp.Body.Close()
		}
	}},
	{"a refused plan's identifiers reach no log line", func(t *testing.T, e *abuseEnv) {
		for _, tc := range []struct{ body, raw string }{
			{`{"envoy":{"domain":"shop","entries":[{"key":"nope","value":"tenant-secret-7731"}]},"limit":5}`, "tenant-secret-7731"},
			{`{"proxy":{"route":0,"ip":"127.0.0.77:4410"},"limit":5}`, "127.0.0.77"},
			{`{"proxy":{"route":0,"header":"hdr-secret-4410"},"limit":5}`, "hdr-secret-4410"},
			{`{"proxy":{"route":9,"ip":"198.51.100.23"},"limit":5}`, "198.51.100.23"},
		} {
			code, out := e.put(t, tc.body)
			if code < 400 || strings.Contains(out, tc.raw) {
				t.Errorf("PUT %s = %d %s, want a refusal without %q", tc.body, code, out, tc.raw)
			}
			if l := logLinesWith(e.s.logs.String(), tc.raw); l != "" {
				t.Errorf("the server's log carries %q after PUT %s:\n%s", tc.raw, tc.body, l)
			}
		}
	}},
	{"a plan of an in-flight rule stays a concurrency limit", func(t *testing.T, e *abuseEnv) {
		for _, f := range []string{`"window":"1m"`, `"burst":9`} {
			code, out := e.put(t, `{"envoy":{"domain":"shop","entries":[{"key":"tenant","value":"t-9"},{"key":"request_id","value":"x"}]},"limit":3,`+f+`}`)
			if code != http.StatusUnprocessableEntity || !strings.Contains(out, "concurrency") {
				t.Errorf("PUT an in-flight plan with %s = %d %s, want 422 naming concurrency", f, code, out)
			}
		}
	}},
	{"a descriptor limit on an in-flight rule is ignored: the in-flight limit holds, never an error", func(t *testing.T, e *abuseEnv) {
		if code, err := e.inFlight(t, "t-full", "first", nil); code != "OK" {
			t.Fatalf("the one stream of t-full = %s %v, want OK", code, err)
		}
		admitted := 0
		for i := range 5 {
			code, err := e.inFlight(t, "t-full", fmt.Sprintf("more-%d", i), &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typepb.RateLimitUnit_MINUTE})
			if err != nil {
				t.Errorf("a limit on an in-flight descriptor: %v, want an answer (Envoy's failure_mode_deny: false admits an error)", err)
			}
			if code == "OK" {
				admitted++
			}
		}
		if admitted != 0 {
			t.Errorf("with t-full's one slot held, a descriptor limit admitted %d of 5 more streams, want 0", admitted)
		}
		if l := logLinesWith(e.s.logs.String(), "more-"); l != "" {
			t.Errorf("the server's log carries a request id of the ignored limits:\n%s", l)
		}
	}},
	{"sluice validate refuses the same config-file plans with their line", func(t *testing.T, e *abuseEnv) {
		for _, tc := range []struct{ row, want, raw string }{
			{`  - { proxy: { route: 1, header: "cfg-a-3301,cfg-b-3301" }, limit: 4 }` + "\n", "overrides[2].proxy.header", "cfg-a-3301"},
			{`  - { envoy: { domain: shop, entries: [{ key: tenant, value: t-cfg-3302 }, { key: request_id, value: x }] }, limit: 4, window: 1m }` + "\n", "overrides[2].window", "t-cfg-3302"},
			{`  - { proxy: { route: 0, ip: "127.0.0.88:1" }, limit: 4 }` + "\n", "overrides[2].proxy.ip", "127.0.0.88"},
		} {
			got := e.validateErr(t, tc.row)
			if !strings.Contains(got, tc.want) || !strings.Contains(got, "(line ") || strings.Contains(got, tc.raw) {
				t.Errorf("validate with %s= %q, want an error naming %s with its line, without %q", tc.row, got, tc.want, tc.raw)
			}
		}
	}},
}

// TestAbuseOverride plays the override operation's hostile or careless
// operator against a real server (its admin API, its proxy and its Envoy
// service over sockets) on memory and Redis, and asserts the bound:
// a plan names the subject its edge decides, or is refused, without the
// identifier in any log line.
func TestAbuseOverride(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testAbuseOverride(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testAbuseOverride(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
}

func testAbuseOverride(t *testing.T, store string) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": abuseOverrideConfig(store, up.URL), "rules/shop.yaml": envoyOverrideRules})
	s := startRunWith(t, server.RunOptions{ConfigPath: filepath.Join(dir, "sluice.yaml"), Getenv: func(k string) string { return overrideEnv[k] }}, "")
	m := proxyListening.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", s.logs)
	}
	e := &abuseEnv{s: s, proxy: m[1], envoy: envoyClient(t, s)}
	for _, row := range abuseOverrideRows {
		t.Run(row.name, func(t *testing.T) { row.play(t, e) })
	}
}
