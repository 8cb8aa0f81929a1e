package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

var envoyLine = regexp.MustCompile(`msg="envoy rate-limit service listening" addr=(\S+)`)

// rulesFile is a rules file in envoyproxy/ratelimit's format with a
// limit of n per hour for each user. Its window opens at the first
// request (align: first_request), not on the clock's hour, so a test
// that runs across a whole hour of the real clock sees no reset.
func rulesFile(n int) string {
	return fmt.Sprintf(`domain: shop
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: %d
      align: first_request
`, n)
}

func envoyConfig(store string) string {
	return `
server: { listen: "127.0.0.1:0" }
` + store + `
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
`
}

// writeTree writes files (relative name → content) under dir.
func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// envoyClient dials the rate-limit service serve logged.
func envoyClient(t *testing.T, s *running) rlspb.RateLimitServiceClient {
	t.Helper()
	m := envoyLine.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no envoy listening line:\n%s", s.logs)
	}
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlspb.NewRateLimitServiceClient(conn)
}

// remaining asks for one hit of user's budget and returns the overall
// code and limit_remaining.
func remaining(t *testing.T, c rlspb.RateLimitServiceClient, user string) (string, uint32, uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{
		{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
	}})
	if err != nil {
		t.Fatalf("ShouldRateLimit(user %s): %v", user, err)
	}
	s := resp.Statuses[0]
	return resp.OverallCode.String(), s.GetCurrentLimit().GetRequestsPerUnit(), s.LimitRemaining
}

func configStatus(t *testing.T, s *running) server.ConfigStatus {
	t.Helper()
	resp, err := http.Get(s.url + "/v1/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cs server.ConfigStatus
	if err := json.NewDecoder(resp.Body).Decode(&cs); err != nil {
		t.Fatalf("GET /v1/config: %v", err)
	}
	return cs
}

func metricValue(t *testing.T, s *running, series string) string {
	t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func testServeEnvoy(t *testing.T, store string) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": envoyConfig(store), "rules/shop.yaml": rulesFile(2)})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	for i, want := range []string{"OK 2 1", "OK 2 0", "OVER_LIMIT 2 0"} {
		code, limit, rem := remaining(t, c, "alice")
		if got := fmt.Sprintf("%s %d %d", code, limit, rem); got != want {
			t.Fatalf("request #%d = %s, want %s", i+1, got, want)
		}
	}
	// The HTTP check API serves beside it.
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"alice"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("POST /v1/check = %d, want 200", resp.StatusCode)
	}
	if v := metricValue(t, s, `sluice_envoy_requests_total{code="OVER_LIMIT"}`); v != "1" {
		t.Errorf("sluice_envoy_requests_total{code=OVER_LIMIT} = %q, want 1", v)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
	if strings.Contains(s.logs.String(), "alice") {
		t.Errorf("serve logs hold a raw descriptor value:\n%s", s.logs)
	}
}

func TestServeEnvoy(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testServeEnvoy(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testServeEnvoy(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
}

// TestReloadOnFileChange edits the rules file under a running serve: a
// new limit is used from the next decision on; a broken file is refused,
// counted and reported while the old rules keep serving.
func TestReloadOnFileChange(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": envoyConfig(""), "rules/shop.yaml": rulesFile(2)})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	if cs := configStatus(t, s); cs.Generation != 1 || len(cs.Hash) != 64 || len(cs.Files) != 2 {
		t.Fatalf("GET /v1/config at start = %+v, want generation 1, a hash and two files", cs)
	}
	if _, limit, _ := remaining(t, c, "bob"); limit != 2 {
		t.Fatalf("limit before the change = %d, want 2", limit)
	}

	writeTree(t, dir, map[string]string{"rules/shop.yaml": rulesFile(5)})
	waitUntil(t, "generation 2", func() bool { return configStatus(t, s).Generation == 2 })
	if code, limit, rem := remaining(t, c, "bob"); code != "OK" || limit != 5 || rem != 3 {
		t.Errorf("after raising the limit to 5: %s limit %d remaining %d, want OK 5 3 (the counter carries over)", code, limit, rem)
	}

	// A broken file: the old rules keep serving.
	writeTree(t, dir, map[string]string{"rules/shop.yaml": "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
	waitUntil(t, "a failed reload", func() bool {
		return metricValue(t, s, `sluice_config_reloads_total{result="failure"}`) == "1"
	})
	cs := configStatus(t, s)
	if cs.Generation != 2 || cs.LastReload == nil || cs.LastReload.Result != "failure" ||
		!strings.Contains(cs.LastReload.Error, `shop.yaml: descriptors[0].rate_limit.unit: "fortnight"`) || !strings.Contains(cs.LastReload.Error, "(line 4)") {
		t.Errorf("GET /v1/config after a broken file = %+v, want generation 2 and the file, line and rule", cs)
	}
	if code, limit, _ := remaining(t, c, "bob"); code != "OK" || limit != 5 {
		t.Errorf("after a broken file: %s limit %d, want the old rules (OK, 5)", code, limit)
	}
	if !strings.Contains(s.logs.String(), "config reload failed") {
		t.Errorf("no log line for the failed reload:\n%s", s.logs)
	}
	if v := metricValue(t, s, "sluice_config_generation"); v != "2" {
		t.Errorf("sluice_config_generation = %q, want 2", v)
	}

	// Putting the serving rules back reloads nothing and says so.
	writeTree(t, dir, map[string]string{"rules/shop.yaml": rulesFile(5)})
	waitUntil(t, "an unchanged reload", func() bool {
		cs := configStatus(t, s)
		return cs.LastReload != nil && cs.LastReload.Result == "unchanged"
	})
	if cs := configStatus(t, s); cs.Generation != 2 {
		t.Errorf("generation after restoring the serving rules = %d, want 2", cs.Generation)
	}

	// The sluice config itself reloads too; what needs a restart is refused.
	cfg := strings.Replace(envoyConfig(""), "limit: 3", "limit: 4", 1)
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg})
	waitUntil(t, "generation 3", func() bool { return configStatus(t, s).Generation == 3 })
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"carol"}`))
	if err != nil {
		t.Fatal(err)
	}
	var a struct{ Limit int }
	json.NewDecoder(resp.Body).Decode(&a)
	resp.Body.Close()
	if a.Limit != 4 {
		t.Errorf("check after raising demo to 4: limit %d, want 4", a.Limit)
	}
	writeTree(t, dir, map[string]string{"sluice.yaml": strings.Replace(cfg, `listen: "127.0.0.1:0" }`, `listen: "127.0.0.1:1" }`, 1)})
	waitUntil(t, "a refused reload", func() bool {
		return metricValue(t, s, `sluice_config_reloads_total{result="failure"}`) == "2"
	})
	if cs := configStatus(t, s); !strings.Contains(cs.LastReload.Error, "server.listen changed") {
		t.Errorf("last reload after changing server.listen = %+v, want a restart-only refusal", cs.LastReload)
	}
}

// TestReloadConfigMapSwap lays the files out as a Kubernetes ConfigMap
// volume does (files are symlinks through ..data to a timestamped
// directory) and swaps ..data the way the kubelet does.
func TestReloadConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name string, limit int) {
		writeTree(t, dir, map[string]string{
			name + "/sluice.yaml":     strings.Replace(envoyConfig(""), `"rules/*.yaml"`, `"shop-rules.yaml"`, 1),
			name + "/shop-rules.yaml": rulesFile(limit),
		})
	}
	version("..2026_01_01_00_00_00.1", 2)
	for _, err := range []error{
		os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")),
		os.Symlink("..data/sluice.yaml", filepath.Join(dir, "sluice.yaml")),
		os.Symlink("..data/shop-rules.yaml", filepath.Join(dir, "shop-rules.yaml")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	if _, limit, _ := remaining(t, c, "dave"); limit != 2 {
		t.Fatalf("limit before the swap = %d, want 2", limit)
	}
	version("..2026_01_01_00_01_00.2", 7)
	if err := os.Symlink("..2026_01_01_00_01_00.2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "generation 2 after the swap", func() bool { return configStatus(t, s).Generation == 2 })
	if _, limit, rem := remaining(t, c, "dave"); limit != 7 || rem != 5 {
		t.Errorf("after the swap: limit %d remaining %d, want 7 and 5", limit, rem)
	}
}

// TestReloadOnSIGHUP sends SIGHUP to this process, where serve has
// registered for it: a reload happens even though no file changed.
func TestReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": envoyConfig(""), "rules/shop.yaml": rulesFile(2)})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "generation 2 after SIGHUP", func() bool { return configStatus(t, s).Generation == 2 })
	if cs := configStatus(t, s); cs.LastReload == nil || cs.LastReload.Trigger != "signal" || cs.LastReload.Result != "success" {
		t.Errorf("last reload = %+v, want a successful one triggered by the signal", cs.LastReload)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestServeEnvoyRulesWithoutLimits serves rules none of which needs the
// store (envoyproxy/ratelimit's unlimited and 0-per-unit rules): they
// start, and a descriptor's limit override still counts.
func TestServeEnvoyRulesWithoutLimits(t *testing.T) {
	dir := t.TempDir()
	// Only an envoy section, whose one rule needs no store: the check API
	// has no policies to answer for.
	cfg := "server: { listen: \"127.0.0.1:0\" }\nenvoy:\n  listen: \"127.0.0.1:0\"\n  configs: [\"rules/*.yaml\"]\n"
	writeTree(t, dir, map[string]string{"sluice.yaml": cfg, "rules/shop.yaml": "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unlimited: true }\n"})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	c := envoyClient(t, s)
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"user","subject":"carol"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "no policies") {
		t.Fatalf("check API with no policies = %d %s; want 404 saying there are no policies", resp.StatusCode, body)
	}
	if code, _, rem := remaining(t, c, "carol"); code != "OK" || rem != 1<<32-1 {
		t.Fatalf("unlimited user = %s, %d remaining; want OK, 4294967295", code, rem)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{{
		Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user", Value: "carol"}},
		Limit:   &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typepb.RateLimitUnit_HOUR},
	}}}
	for i, want := range []string{"OK", "OVER_LIMIT"} {
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode.String() != want {
			t.Fatalf("override #%d = %v, %v; want %s", i+1, resp, err, want)
		}
	}
}
