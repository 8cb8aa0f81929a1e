package server_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/server"
)

// TestOverridesProxyClient: a tenant plan names a client of the reverse
// proxy as a route sees it, by address (masked as the route masks it) or
// by the value of the route's subject header, through the admin API; the
// proxy applies it to that client alone. A config file's override names
// one likewise.
func TestOverridesProxyClient(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	cfg := strings.Replace(overridesConfig(""), `  - { id: conc, algorithm: concurrency, limit: 2, lease_ttl: 30s }`, `  - { id: conc, algorithm: concurrency, limit: 2, lease_ttl: 30s }
  - { id: login, algorithm: fixed_window, limit: 2, window: 1h }`, 1) + `  - { proxy: { route: 1, header: vipkey }, limit: 3, note: vip from the config }
proxy:
  listen: "127.0.0.1:0"
  upstream: "` + up.URL + `"
  routes:
    - { match: { path_prefix: /login }, policies: [login], subject: ip }
    - { match: { path_prefix: /api }, policies: [api], subject: "header:X-API-Key" }
`
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startRunWith(t, server.RunOptions{ConfigPath: path, Getenv: func(k string) string { return overrideEnv[k] }}, "")
	m := proxyListening.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", s.logs)
	}
	admitted := func(n int, route, key string) int {
		t.Helper()
		ok := 0
		for range n {
			req, err := http.NewRequest("GET", m[1]+route, nil)
			if err != nil {
				t.Fatal(err)
			}
			if key != "" {
				req.Header.Set("X-API-Key", key)
			}
			resp, err := http.DefaultClient.Do(req)
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
	for _, body := range []string{
		`{"proxy":{"route":0,"ip":"127.0.0.1"},"limit":5,"note":"office"}`,
		`{"policy":"api","proxy":{"route":1,"header":"acme"},"limit":12,"note":"acme plan"}`,
	} {
		if code, out := call(t, "PUT", s.url+"/v1/overrides", ovrAdminToken, body); code != 200 || strings.Contains(out, "127.0.0.1") || strings.Contains(out, `acme"`) {
			t.Fatalf("PUT %s = %d %s, want 200 without the client", body, code, out)
		}
	}
	if n := admitted(8, "/login", ""); n != 5 {
		t.Errorf("this address on /login under its plan of 5: %d admitted, want 5", n)
	}
	if n := admitted(15, "/api", "acme"); n != 12 {
		t.Errorf("key acme on /api under its plan of 12: %d admitted, want 12", n)
	}
	if n := admitted(15, "/api", "other"); n != 10 {
		t.Errorf("another key on /api: %d admitted, want the policy's 10", n)
	}
	if n := admitted(15, "/api", "vipkey"); n != 3 {
		t.Errorf("key vipkey on /api under the config file's plan of 3: %d admitted, want 3", n)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"proxy":{"route":0,"header":"acme"},"limit":5}`, "its subject is ip, not a header"},
		{`{"proxy":{"route":7,"ip":"127.0.0.1"},"limit":5}`, "proxy.route: 7: the proxy has routes 0 to 1"},
		{`{"proxy":{"route":0,"ip":"nonsense"},"limit":5}`, "not a client address"},
		{`{"policy":"api","proxy":{"route":0,"ip":"127.0.0.1"},"limit":5}`, "must be one of the route's policies"},
	} {
		if code, out := call(t, "PUT", s.url+"/v1/overrides", ovrAdminToken, tc.body); code != 400 || !strings.Contains(out, tc.want) {
			t.Errorf("PUT %s = %d %s, want 400 %q", tc.body, code, out, tc.want)
		}
	}
}
