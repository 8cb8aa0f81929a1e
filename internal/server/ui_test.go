package server_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var adminToken = server.Token{ID: "admin", Secret: []byte("admin-secret-0123456789"), Scopes: []string{"admin"}}

// get sends a GET to url with an Authorization header (none when auth is
// "") and returns the status, the body and the response's header.
func get(t *testing.T, url, auth string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(raw), resp.Header
}

func TestUIAdminScope(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{Tokens: []server.Token{appToken, adminToken}})
	basic := func(user, password string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	}
	for _, path := range []string{"/ui", "/ui/app.js", "/ui/api/state"} {
		for _, c := range []struct {
			name, auth string
			code       int
		}{
			{"no token", "", 401},
			{"wrong token", "Bearer not-a-token-at-all-0123", 401},
			{"check scope only", "Bearer " + string(appToken.Secret), 403},
			{"admin bearer", "Bearer " + string(adminToken.Secret), 200},
			{"admin basic", basic("anyone", string(adminToken.Secret)), 200},
		} {
			code, body, h := get(t, f.url+path, c.auth)
			if code != c.code {
				t.Errorf("GET %s with %s = %d %q, want %d", path, c.name, code, body, c.code)
			}
			if code == 401 && !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("GET %s with %s: WWW-Authenticate = %q, want a Basic challenge a browser answers", path, c.name, h.Get("WWW-Authenticate"))
			}
			if code == 403 && !strings.Contains(body, `token "app" lacks scope admin`) {
				t.Errorf("GET %s with %s: body %q, want it to name the token and the scope", path, c.name, body)
			}
		}
	}
	// The check API does not take the admin scope for a check.
	if code, _, _ := send(t, f.url, "Bearer "+string(adminToken.Secret), `{"policy":"demo","subject":"a"}`); code != 403 {
		t.Errorf("POST /v1/check with an admin-only token = %d, want 403", code)
	}
}

func TestUIPageIsSelfContained(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	code, page, h := get(t, f.url+"/ui", "")
	if code != 200 || h.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /ui = %d %s", code, h.Get("Content-Type"))
	}
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Errorf("GET /ui: Content-Security-Policy = %q, want default-src 'self'", csp)
	}
	for _, asset := range []string{"/ui/app.js", "/ui/app.css"} {
		if !strings.Contains(page, `"`+asset+`"`) {
			t.Errorf("the page does not load %s", asset)
		}
		if code, body, _ := get(t, f.url+asset, ""); code != 200 || len(body) == 0 {
			t.Errorf("GET %s = %d, %d bytes", asset, code, len(body))
		}
	}
	for _, path := range []string{"/ui", "/ui/app.js", "/ui/app.css"} {
		_, body, _ := get(t, f.url+path, "")
		for _, external := range []string{"http://", "https://", "//cdn", "@import"} {
			if strings.Contains(strings.ReplaceAll(body, "http://www.w3.org/2000/svg", ""), external) {
				t.Errorf("%s mentions %q: the dashboard must load nothing from elsewhere", path, external)
			}
		}
	}
	if code, _, _ := get(t, f.url+"/ui/other.js", ""); code != 404 {
		t.Errorf("GET /ui/other.js = %d, want 404", code)
	}
}

// uiState is the part of GET /ui/api/state the tests read.
type uiState struct {
	Now         int64 `json:"now"`
	LiveSeconds int   `json:"live_seconds"`
	Store       struct {
		Type    string `json:"type"`
		Ready   bool   `json:"ready"`
		Breaker string `json:"breaker"`
	} `json:"store"`
	Config   *server.ConfigStatus `json:"config"`
	Policies []struct {
		ID        string `json:"id"`
		Algorithm string `json:"algorithm"`
		Limit     int64  `json:"limit"`
		Window    string `json:"window"`
		Burst     int64  `json:"burst"`
	} `json:"policies"`
	Live []server.LiveSeries `json:"live"`
}

func TestUIStateCountsDecisionsPerSecond(t *testing.T) {
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"demo", "login", "api", "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	clock := sluicetest.NewClock()
	server.SetMetricsClock(m, clock) // before the server serves: no race
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	f := newFixtureOn(t, &recordingStore{Store: ms}, clock, demoPolicies, server.Options{
		Metrics:      m,
		Store:        server.StoreInfo{Type: "redis", Breaker: func() string { return "half_open" }},
		ConfigStatus: func() server.ConfigStatus { return server.ConfigStatus{Generation: 7} },
	})
	for range 4 {
		f.post(t, `{"policy":"demo","subject":"alice@example.com"}`) // 3 allowed, 1 denied
	}
	f.clock.Advance(2 * time.Second)
	f.post(t, `{"policies":["login","api"],"subject":"alice@example.com"}`)
	f.post(t, `{"policy":"nope","subject":"alice@example.com"}`)

	code, body, _ := get(t, f.url+"/ui/api/state", "")
	if code != 200 {
		t.Fatalf("GET /ui/api/state = %d %s", code, body)
	}
	if strings.Contains(body, "alice") || strings.Contains(body, f.pseud.Pseudonym("api", "alice@example.com", "")) {
		t.Errorf("GET /ui/api/state names the subject or its pseudonym: %s", body)
	}
	var st uiState
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Now != f.clock.Now().Unix() || st.LiveSeconds != server.LiveSeconds {
		t.Errorf("now, live_seconds = %d, %d; want %d, %d", st.Now, st.LiveSeconds, f.clock.Now().Unix(), server.LiveSeconds)
	}
	if st.Store.Type != "redis" || !st.Store.Ready || st.Store.Breaker != "half_open" || st.Config == nil || st.Config.Generation != 7 {
		t.Errorf("store %+v, config %+v; want redis, ready, half_open, generation 7", st.Store, st.Config)
	}
	if len(st.Policies) != 4 || st.Policies[2].ID != "api" || st.Policies[2].Algorithm != "gcra" || st.Policies[2].Burst != 20 || st.Policies[2].Window != "1s" {
		t.Errorf("policies = %+v, want the four configured, api as gcra 100/1s burst 20", st.Policies)
	}
	last := server.LiveSeconds - 1
	want := map[string]map[string][2]int64{ // policy → outcome → {count now, count 2s ago}
		"demo":  {"allowed": {0, 3}, "denied": {0, 1}},
		"login": {"allowed": {1, 0}, "denied": {0, 0}},
		"api":   {"allowed": {1, 0}, "denied": {0, 0}},
	}
	for _, s := range st.Live {
		for outcome, w := range want[s.Policy] {
			c := s.Counts[outcome]
			if len(c) != server.LiveSeconds || c[last] != w[0] || c[last-2] != w[1] || s.Total[outcome] != w[0]+w[1] {
				t.Errorf("live %s %s: now %v, 2s ago %v, total %d; want %v", s.Policy, outcome, at(c, last), at(c, last-2), s.Total[outcome], w)
			}
		}
	}
	if len(st.Live) != 4 {
		t.Errorf("live has %d series, want one per configured policy (4)", len(st.Live))
	}
	// Decisions older than the span drop out.
	f.clock.Advance(server.LiveSeconds * time.Second)
	_, body, _ = get(t, f.url+"/ui/api/state", "")
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Live {
		if s.Total["allowed"] != 0 || s.Total["denied"] != 0 {
			t.Errorf("live %s after %ds: totals %v, want none", s.Policy, server.LiveSeconds, s.Total)
		}
	}
}

func at(c []int64, i int) any {
	if i < len(c) {
		return c[i]
	}
	return "absent"
}

func TestUISimulate(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	post := func(contentType, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(f.url+"/ui/api/simulate", contentType, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}
	code, out := post("application/json", `{"algorithm":"all","limit":10,"window":"10s","pattern":"boundary"}`)
	if code != 200 || !strings.HasPrefix(out["svg"].(string), "<svg ") {
		t.Fatalf("simulate boundary = %d %v", code, out["error"])
	}
	results := out["results"].([]any)
	fixed := results[0].(map[string]any)
	if len(results) != 5 || fixed["algorithm"] != "fixed_window" || fixed["max_in_window"] != 19.0 {
		t.Errorf("simulate boundary results = %v, want five with fixed_window's 19 first", results)
	}
	for _, c := range []struct{ body, want string }{
		{`{"algorithm":"gcra","limit":0,"window":"10s","pattern":"boundary"}`, "limit = 0: must be between 1 and 1000000000"},
		{`{"algorithm":"leaky","limit":10,"window":"10s","pattern":"boundary"}`, `algorithm = "leaky": must be one of all,`},
		{`{"algorithm":"gcra","limit":10,"window":"ten","pattern":"boundary"}`, `window = "ten": must be a positive duration`},
		{`{"algorithm":"gcra","limit":10,"window":"10s","pattern":"zigzag"}`, `pattern = "zigzag": must be one of`},
		{`{"algorithm":"gcra","limit":10,"window":"10s","pattern":"poisson","duration":"1h"}`, `duration = "1h": must be a duration between one window and 100 windows`},
		{`{"algorithm":"gcra","limit":10,"window":"10s","pattern":"poisson","rate":1000}`, "rate = 1000: rate × duration is 300000 requests: at most 20000"},
		{`{"algorithm":"sliding_log","limit":50000,"window":"10s","pattern":"boundary"}`, "limit = 50000: the boundary pattern offers 2 × limit requests: at most 20000"},
		{`{"algorithm":"fixed_window","limit":10,"burst":3,"window":"10s","pattern":"ramp"}`, "burst = 3: applies only to token_bucket and gcra"},
		{`{"algorithm":"gcra","limit":10,"window":"10s","pattern":"ramp","subject":"x"}`, `malformed JSON: unknown field "subject"`},
		{`{"algorithm":"gcra","limit":10,"window":"10s","pattern":"ramp"} trailing`, "malformed JSON: more than one value in the body"},
		{`{"algorithm":"gcra","limit":10,"window":"10s","pattern":"ramp"}{}`, "malformed JSON: more than one value in the body"},
		{``, "request body is empty: want a JSON object"},
		{`{"algorithm":"gcra","pattern":"` + strings.Repeat("x", 5000) + `"}`, "request body is larger than 4096 bytes"},
	} {
		code, out := post("application/json", c.body)
		if msg, _ := out["error"].(string); code != 400 || !strings.Contains(msg, c.want) {
			t.Errorf("simulate %.80s = %d %q, want 400 %q", c.body, code, msg, c.want)
		}
	}
	if code, _ := post("text/plain", `{}`); code != http.StatusUnsupportedMediaType {
		t.Errorf("simulate as text/plain = %d, want 415", code)
	}
}
