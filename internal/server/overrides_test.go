package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

const (
	ovrAdminToken = "admin-token-0123456789abcdef"
	ovrCheckToken = "check-token-0123456789abcdef"
)

// overridesConfig is a config with an admin and a check token, one HMAC
// key (so two servers agree on pseudonyms), store, and a config-file
// override of subject "gold" on api.
func overridesConfig(store string) string {
	return `server:
  listen: 127.0.0.1:0
  auth:
    tokens:
      - { id: ops, secret_env: OVR_ADMIN, scopes: [admin] }
      - { id: app, secret_env: OVR_CHECK, scopes: [check] }
subjects:
  hmac_keys:
    - { id: k1, secret_env: OVR_HMAC }
` + store + `
policies:
  - { id: api, algorithm: fixed_window, limit: 10, window: 1m }
  - { id: conc, algorithm: concurrency, limit: 2, lease_ttl: 30s }
overrides:
  - { policy: api, subject: gold, limit: 50, note: gold plan from the config }
`
}

var overrideEnv = map[string]string{"OVR_ADMIN": ovrAdminToken, "OVR_CHECK": ovrCheckToken, "OVR_HMAC": "hmac-secret-0123456789abcdef0123456789"}

// startOverrideServer runs cfg in this process with its own Limiter.
func startOverrideServer(t testing.TB, cfg string) string {
	t.Helper()
	url, _ := startOverrideServerAt(t, cfg)
	return url
}

// startOverrideServerAt is startOverrideServer, also returning the
// config file's path.
func startOverrideServerAt(t testing.TB, cfg string) (string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() {
		done <- server.Run(ctx, server.RunOptions{ConfigPath: path, Log: log, Getenv: func(k string) string { return overrideEnv[k] }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var url string
	waitUntil(t, "the listening line", func() bool {
		if m := listening.FindStringSubmatch(logs.String()); m != nil {
			url = m[1]
		}
		return url != ""
	})
	return url, path
}

// call sends method path with body and token, and returns the status and
// the body.
func call(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := openAPIClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// spend checks cost units of api for subject and returns the answer.
func spend(t *testing.T, url, subject string, cost int) checkapi.Answer {
	t.Helper()
	code, body := call(t, "POST", url+"/v1/check", ovrCheckToken, fmt.Sprintf(`{"policy":"api","subject":%q,"cost":%d}`, subject, cost))
	a, err := checkapi.ParseAnswer([]byte(body))
	if err != nil || (code != 200 && code != 429) {
		t.Fatalf("check %s cost %d = %d %s (%v)", subject, cost, code, body, err)
	}
	return a
}

func TestOverridesAdminAPI(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testOverridesAdminAPI(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testOverridesAdminAPI(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
}

func testOverridesAdminAPI(t *testing.T, store string) {
	url := startOverrideServer(t, overridesConfig(store))
	tenant := fmt.Sprintf("tenant-%d", time.Now().UnixNano())
	if a := spend(t, url, "gold", 1); a.Limit != 50 || a.Remaining != 49 {
		t.Fatalf("the config's override: %+v, want 49 of 50", a)
	}
	if a := spend(t, url, tenant, 8); a.Remaining != 2 {
		t.Fatalf("spend 8 of 10: %+v", a)
	}
	// Authorization: no token 401, a check token 403.
	put := fmt.Sprintf(`{"policy":"api","subject":%q,"limit":100,"note":"acme raised"}`, tenant)
	if code, _ := call(t, "PUT", url+"/v1/overrides", "", put); code != 401 {
		t.Fatalf("PUT without a token = %d, want 401", code)
	}
	if code, _ := call(t, "PUT", url+"/v1/overrides", ovrCheckToken, put); code != 403 {
		t.Fatalf("PUT with a check token = %d, want 403", code)
	}
	for _, bad := range []struct {
		body string
		code int
		want string
	}{
		{`{"policy":"nope","subject":"x","limit":5}`, 404, "unknown policy"},
		{`{"policy":"api","subject":"x","limit":5,"burst":9}`, 422, "burst = 9"},
		{`{"policy":"conc","subject":"x","limit":5,"window":"1s"}`, 422, "does not apply to concurrency"},
		{`{"policy":"api","subject":"x","limit":0}`, 400, "limit = 0"},
		{`{"policy":"api","subject":"x","limit":5,"window":"soon"}`, 400, "must be a duration"},
		{`{"policy":"api","limit":5}`, 400, "subject is 0 bytes"},
		{`{"policy":"api","subject":"x","limit":5,"colour":1}`, 400, "unknown field"},
	} {
		if code, body := call(t, "PUT", url+"/v1/overrides", ovrAdminToken, bad.body); code != bad.code || !strings.Contains(body, bad.want) {
			t.Errorf("PUT %s = %d %s, want %d with %q", bad.body, code, body, bad.code, bad.want)
		}
	}
	if code, body := call(t, "PUT", url+"/v1/overrides", ovrAdminToken, put); code != 200 || !strings.Contains(body, `"note":"acme raised"`) {
		t.Fatalf("PUT = %d %s", code, body)
	}
	if a := spend(t, url, tenant, 1); a.Limit != 100 || a.Remaining != 91 {
		t.Fatalf("after the raise: %+v, want 91 of 100 (8 + 1 spent)", a)
	}
	code, body := call(t, "GET", url+"/v1/overrides?policy=api", ovrAdminToken, "")
	var list checkapi.OverrideList
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil {
		t.Fatalf("GET = %d %s (%v)", code, body, err)
	}
	if strings.Contains(body, tenant) || strings.Contains(body, "gold\"") {
		t.Fatalf("GET shows a subject: %s", body)
	}
	notes := map[string]checkapi.OverrideEntry{}
	for _, e := range list.Overrides {
		notes[e.Note] = e
	}
	if e := notes["acme raised"]; e.Limit != 100 || e.Source != "api" || e.Window != "1m0s" {
		t.Fatalf("GET's entry of the raise = %+v in %s", e, body)
	}
	if e := notes["gold plan from the config"]; e.Limit != 50 || e.Source != "config" {
		t.Fatalf("GET's entry of the config's = %+v in %s", e, body)
	}
	checkCounts(t, url, 2)
	code, body = call(t, "GET", url+"/ui/api/state", ovrAdminToken, "")
	if code != 200 || !strings.Contains(body, `"note":"acme raised"`) || !strings.Contains(body, `"note":"gold plan from the config"`) || strings.Contains(body, tenant) {
		t.Fatalf("/ui/api/state = %d %s, want both overrides by note and no subject", code, body)
	}
	if code, body := call(t, "DELETE", url+"/v1/overrides", ovrAdminToken, `{"policy":"api","subject":"gold"}`); code != 409 || !strings.Contains(body, "config file") {
		t.Fatalf("DELETE of the config's override = %d %s, want 409 naming the config file", code, body)
	}
	if a := spend(t, url, "gold", 1); a.Limit != 50 {
		t.Fatalf("after a refused DELETE, the config's override: %+v, want still limit 50", a)
	}
	del := fmt.Sprintf(`{"policy":"api","subject":%q}`, tenant)
	if code, body := call(t, "DELETE", url+"/v1/overrides", ovrAdminToken, del); code != 200 {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	if a := spend(t, url, tenant, 1); a.Limit != 10 || !a.Allowed || a.Remaining != 0 {
		t.Fatalf("after DELETE: %+v, want the 10th of 10 allowed (9 spent before)", a)
	}
	if a := spend(t, url, tenant, 1); a.Allowed {
		t.Fatalf("after DELETE: %+v, want the 11th denied", a)
	}
	checkCounts(t, url, 1)
}

// checkCounts reads /v1/config and /metrics: api has n overrides.
func checkCounts(t *testing.T, url string, n int) {
	t.Helper()
	_, body := call(t, "GET", url+"/v1/config", "", "")
	var st server.ConfigStatus
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Overrides["api"] != n || st.Overrides["conc"] != 0 || len(st.ConfigOverrides) != 1 || st.ConfigOverrides[0].Note != "gold plan from the config" {
		t.Fatalf("/v1/config overrides = %v, config_overrides %+v; want api %d", st.Overrides, st.ConfigOverrides, n)
	}
	_, metrics := call(t, "GET", url+"/metrics", "", "")
	if want := fmt.Sprintf(`sluice_overrides{policy="api"} %d`, n); !strings.Contains(metrics, want) {
		t.Fatalf("/metrics lacks %q", want)
	}
}

// TestOverridesAcrossServers: two servers, each with its own Limiter, on
// one Redis (standalone, then the 3-master cluster): an override set
// through one is applied by the other within a bounded wait, and the
// spent count is kept (8 of 10 spent, raised to 100: 92 left).
func TestOverridesAcrossServers(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testOverridesAcross(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
	t.Run("cluster", func(t *testing.T) {
		cl, err := redistest.StartCluster(3, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Stop)
		testOverridesAcross(t, fmt.Sprintf("store: { type: redis, redis: { addrs: [%q], mode: cluster } }", cl.Addrs[0]))
	})
}

func testOverridesAcross(t *testing.T, store string) {
	a := startOverrideServer(t, overridesConfig(store))
	b := startOverrideServer(t, overridesConfig(store))
	tenant := fmt.Sprintf("tenant-%d", time.Now().UnixNano())
	if got := spend(t, b, tenant, 8); got.Remaining != 2 {
		t.Fatalf("spend 8 of 10 through b: %+v", got)
	}
	put := fmt.Sprintf(`{"policy":"api","subject":%q,"limit":100,"note":"raised via a"}`, tenant)
	if code, body := call(t, "PUT", a+"/v1/overrides", ovrAdminToken, put); code != 200 {
		t.Fatalf("PUT through a = %d %s", code, body)
	}
	peek := func() checkapi.Answer {
		code, body := call(t, "POST", b+"/v1/check", ovrCheckToken, fmt.Sprintf(`{"policy":"api","subject":%q,"cost":0}`, tenant))
		ans, err := checkapi.ParseAnswer([]byte(body))
		if err != nil || code != 200 {
			t.Fatalf("peek through b = %d %s (%v)", code, body, err)
		}
		return ans
	}
	// The bound: every Limiter re-reads within about 1s; 5s leaves room
	// for a loaded machine without asserting any speed.
	set := time.Now()
	deadline := set.Add(5 * time.Second)
	defer func() {
		t.Logf("b applied the override %v after a's PUT answered", time.Since(set).Round(time.Millisecond))
	}()
	for peek().Limit != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("b still answers %+v 5s after the override was set through a", peek())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := peek(); got.Remaining != 92 {
		t.Fatalf("through b after the raise: %+v, want 92 of 100 left", got)
	}
}

// TestOverridesHotReload: the config's overrides: section is reloaded
// with the rest of the file.
func TestOverridesHotReload(t *testing.T) {
	cfg := overridesConfig("")
	url, path := startOverrideServerAt(t, cfg)
	if a := spend(t, url, "gold", 1); a.Limit != 50 {
		t.Fatalf("before the reload: %+v, want the config's 50", a)
	}
	saveLikeSed(t, path, strings.Replace(cfg, "limit: 50, note: gold plan from the config", "limit: 70, note: gold plan raised", 1))
	waitUntil(t, "the reloaded override", func() bool { return spend(t, url, "gold", 0).Limit == 70 })
	if a := spend(t, url, "gold", 0); a.Remaining != 69 {
		t.Fatalf("after the reload: %+v, want 69 of 70: the spent unit kept", a)
	}
}

// TestOverridesNeedTokens: without tokens, changing overrides is refused
// (listing stays open, as the dashboard is).
func TestOverridesNeedTokens(t *testing.T) {
	url := startOverrideServer(t, `server: { listen: 127.0.0.1:0 }
policies:
  - { id: api, algorithm: fixed_window, limit: 10, window: 1m }
`)
	if code, body := call(t, "PUT", url+"/v1/overrides", "", `{"policy":"api","subject":"x","limit":5}`); code != 403 || !strings.Contains(body, "no tokens are configured") {
		t.Fatalf("PUT without tokens configured = %d %s, want 403", code, body)
	}
	if code, body := call(t, "GET", url+"/v1/overrides", "", ""); code != 200 || !strings.Contains(body, `"overrides":[]`) {
		t.Fatalf("GET without tokens configured = %d %s, want 200 and none", code, body)
	}
}

// TestOverridesSkipUnreadableField: a field of the overrides hash that no
// sluice of this version wrote (HSET by hand, by another tool, by a later
// sluice during a rolling upgrade) used to fail every read of the hash: a
// restarted server applied no API override (4 of 4 admitted for a tenant
// of 3), the admin GET answered 503 and sluice_overrides left /metrics.
// Now the field is skipped and counted, and the rest apply.
func TestOverridesSkipUnreadableField(t *testing.T) {
	srv := redistest.Standalone(t)
	cfg := overridesConfig(fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	a := startOverrideServer(t, cfg)
	tenant := fmt.Sprintf("tenant-%d", time.Now().UnixNano())
	put := fmt.Sprintf(`{"policy":"api","subject":%q,"limit":3,"note":"small plan"}`, tenant)
	if code, body := call(t, "PUT", a+"/v1/overrides", ovrAdminToken, put); code != 200 {
		t.Fatalf("PUT = %d %s", code, body)
	}
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	if err := c.HSet(ctx, "sluice:{overrides}", "big:written-by-another-tool", "2|5|0|0|future format").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Incr(ctx, "sluice:{overrides}:version").Err(); err != nil {
		t.Fatal(err)
	}
	b := startOverrideServer(t, cfg) // a server started after the field was written
	code, body := call(t, "GET", b+"/v1/overrides", ovrAdminToken, "")
	if code != 200 || !strings.Contains(body, "small plan") || !strings.Contains(body, "gold plan from the config") {
		t.Fatalf("GET /v1/overrides = %d %s, want 200 listing the small plan and the config's gold plan", code, body)
	}
	if got := spend(t, b, tenant, 0); got.Limit != 3 {
		t.Fatalf("the restarted server answers %+v, want the tenant's limit 3", got)
	}
	for i := range 4 {
		if got := spend(t, b, tenant, 1); got.Allowed != (i < 3) {
			t.Fatalf("spend %d of a tenant of 3: %+v", i+1, got)
		}
	}
	checkCounts(t, b, 2)
	_, metrics := call(t, "GET", b+"/metrics", "", "")
	// 1, or 2 when the read at start and the GET's both read the hash.
	if want := regexp.MustCompile(`\nsluice_overrides_skipped_total\{store="redis"\} [12]\n`); !want.MatchString(metrics) {
		t.Fatalf("/metrics lacks %s", want)
	}
}

// TestOverridesAPIOverConfig: an override set through the API on top of
// the config file's for the same subject could not be deleted (409, as if
// it were the file's): DELETE now removes the API's, and the file's
// applies again; a DELETE with only the file's left is still 409.
func TestOverridesAPIOverConfig(t *testing.T) {
	url := startOverrideServer(t, overridesConfig(""))
	if code, body := call(t, "PUT", url+"/v1/overrides", ovrAdminToken, `{"policy":"api","subject":"gold","limit":70,"note":"gold raised"}`); code != 200 {
		t.Fatalf("PUT over the config's override = %d %s", code, body)
	}
	if a := spend(t, url, "gold", 0); a.Limit != 70 {
		t.Fatalf("after the PUT: %+v, want limit 70", a)
	}
	if code, body := call(t, "DELETE", url+"/v1/overrides", ovrAdminToken, `{"policy":"api","subject":"gold"}`); code != 200 || !strings.Contains(body, "gold plan from the config") {
		t.Fatalf("DELETE of the API's override over the config's = %d %s, want 200 listing the config's, in force again", code, body)
	}
	if a := spend(t, url, "gold", 0); a.Limit != 50 {
		t.Fatalf("after the DELETE: %+v, want the config's limit 50", a)
	}
	if code, body := call(t, "DELETE", url+"/v1/overrides", ovrAdminToken, `{"policy":"api","subject":"gold"}`); code != 409 || !strings.Contains(body, "config file") {
		t.Fatalf("DELETE with only the config's override left = %d %s, want 409 naming the config file", code, body)
	}
}

// TestOverridesRefuseTrailingData: the admin API took the first JSON
// value of a body and ignored what followed; it now refuses it as the
// check API does.
func TestOverridesRefuseTrailingData(t *testing.T) {
	url := startOverrideServer(t, overridesConfig(""))
	for _, body := range []string{
		`{"policy":"api","subject":"t1","limit":5} garbage`,
		`{"policy":"api","subject":"t1","limit":5}{"policy":"api","subject":"t2","limit":500}`,
	} {
		if code, got := call(t, "PUT", url+"/v1/overrides", ovrAdminToken, body); code != 400 || !strings.Contains(got, "more than one value") {
			t.Errorf("PUT %s = %d %s, want 400 naming the trailing data", body, code, got)
		}
	}
	if code, got := call(t, "DELETE", url+"/v1/overrides", ovrAdminToken, `{"policy":"api","subject":"t1"} x`); code != 400 {
		t.Errorf("DELETE with trailing data = %d %s, want 400", code, got)
	}
}
