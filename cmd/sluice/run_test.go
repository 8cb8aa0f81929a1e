package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// logSink collects what serve writes to stderr and reports the listen
// address as soon as it is logged.
type logSink struct {
	mu   sync.Mutex
	b    bytes.Buffer
	addr chan string
	sent bool
}

var listenLine = regexp.MustCompile(`msg=listening addr=(https?://\S+)|"msg":"listening","addr":"(https?://[^"]+)"`)

func newLogSink() *logSink { return &logSink{addr: make(chan string, 1)} }

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Write(p)
	if m := listenLine.FindSubmatch(s.b.Bytes()); m != nil && !s.sent {
		s.sent = true
		s.addr <- string(m[1]) + string(m[2])
	}
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// served is a sluice serve started by run in the background.
type served struct {
	url  string
	logs *logSink
	stop func() error // cancels the context and returns run's error
}

// startServe runs "sluice serve" with args and waits for its address.
func startServe(t *testing.T, args ...string) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := newLogSink()
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"serve"}, args...), io.Discard, logs) }()
	var url string
	select {
	case url = <-logs.addr:
	case err := <-done:
		cancel()
		t.Fatalf("serve %v returned before listening: %v\n%s", args, err, logs)
	}
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	return &served{url: url, logs: logs, stop: stop}
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The end-to-end test runs on the real clock, so its window is an hour
// rather than 10s: the verdicts must not depend on how fast the machine
// is. internal/server tests the 3-per-10s scenario on a fake clock.
const demoConfig = `
server:
  listen: "127.0.0.1:0"
policies:
  - id: demo
    algorithm: fixed_window
    limit: 3
    window: 1h
  - id: reports
    algorithm: concurrency
    limit: 1
    lease_ttl: 1h
`

func TestServeEndToEnd(t *testing.T) {
	s := startServe(t, "-c", writeConfig(t, demoConfig), "--log-level", "debug")
	for i, want := range []int{200, 200, 200, 429} {
		resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"alice"}`))
		if err != nil {
			t.Fatal(err)
		}
		var a struct {
			Outcome   string `json:"outcome"`
			Remaining int64  `json:"remaining"`
		}
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != want {
			t.Fatalf("check #%d: status %d, want %d", i+1, resp.StatusCode, want)
		}
		if want == 429 {
			if a.Outcome != "denied" {
				t.Errorf("check #4: outcome %q, want denied", a.Outcome)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "3600" && ra != "3599" {
				t.Errorf("check #4: Retry-After = %q, want about 3600", ra)
			}
		}
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/readyz/store": 200, "/openapi.yaml": 200} {
		resp, err := http.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v, want a clean shutdown", err)
	}
	logs := s.logs.String()
	for _, want := range []string{"level=WARN msg=\"subjects.hmac_keys is not configured", "msg=\"shutting down\"", "msg=stopped", "status=429"} {
		if !strings.Contains(logs, want) {
			t.Errorf("serve logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "alice") {
		t.Errorf("serve logs hold the raw subject:\n%s", logs)
	}
	if _, err := http.Get(s.url + "/healthz"); err == nil {
		t.Errorf("GET /healthz after shutdown succeeded; want the listener closed")
	}
}

func TestServeHelp(t *testing.T) {
	// The built-in example listens on 127.0.0.1:8080, which a test cannot
	// count on being free; check what it would serve instead.
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help"}, &out, &errOut); err != nil {
		t.Fatalf("serve --help: %v", err)
	}
	if !strings.Contains(out.String(), "built-in example") {
		t.Errorf("serve --help = %q, want it to mention the built-in example", out.String())
	}
}

func TestCheckCommand(t *testing.T) {
	s := startServe(t, "--config", writeConfig(t, demoConfig))
	check := func(extra ...string) (int, string) {
		var out, errOut bytes.Buffer
		args := append([]string{"check", "--url", s.url, "--policy", "demo", "--subject", "bob"}, extra...)
		code := exitCode(run(context.Background(), args, &out, &errOut), &errOut)
		return code, out.String()
	}
	if code, out := check("--cost", "0"); code != 0 || !strings.Contains(out, `"remaining":3`) {
		t.Fatalf("check --cost 0 = %d %q, want 0 with remaining 3 (a peek)", code, out)
	}
	for i, want := range []int{0, 0, 0, 1} {
		code, out := check()
		if code != want {
			t.Fatalf("check #%d: exit %d, want %d (output %q)", i+1, code, want, out)
		}
		if want == 1 && !strings.Contains(out, `"outcome":"denied"`) {
			t.Errorf("check #4 printed %q, want the denied answer", out)
		}
	}
	if code, out := check("--refund"); code != 0 || !strings.Contains(out, `"remaining":1`) {
		t.Fatalf("check --refund = %d %q, want 0 with remaining 1", code, out)
	}
	if code, _ := check(); code != 0 {
		t.Fatalf("check after the refund: exit %d, want 0", code)
	}
	if code, out := check("--cost", "4"); code != 2 || !strings.Contains(out, `"outcome":"incompatible"`) {
		t.Errorf("check --cost 4 = %d %q, want 2 with the incompatible answer", code, out)
	}
	// bob has spent 3 of 3: a reset unlocks him at once.
	if code, _ := check(); code != 1 {
		t.Fatalf("check with the budget spent: exit %d, want 1 (denied)", code)
	}
	if code, out := check("--reset"); code != 0 || !strings.Contains(out, `"remaining":3`) {
		t.Fatalf("check --reset = %d %q, want 0 with remaining 3", code, out)
	}
	if code, out := check(); code != 0 || !strings.Contains(out, `"remaining":2`) {
		t.Fatalf("check after the reset = %d %q, want 0 with remaining 2", code, out)
	}
	if code, out := check("--reset", "--cost", "1"); code != 2 || !strings.Contains(out, "a reset takes no cost") {
		t.Errorf("check --reset --cost 1 = %d %q, want 2 saying a reset takes no cost", code, out)
	}
	// A concurrency policy: the check answers a lease_id, --release gives it back.
	lease := func(extra ...string) (int, string) {
		var out, errOut bytes.Buffer
		args := append([]string{"check", "--url", s.url, "--policy", "reports", "--subject", "bob"}, extra...)
		code := exitCode(run(context.Background(), args, &out, &errOut), &errOut)
		return code, out.String()
	}
	code, answer := lease()
	var held struct {
		LeaseID string `json:"lease_id"`
	}
	if err := json.Unmarshal([]byte(answer), &held); code != 0 || err != nil || held.LeaseID == "" {
		t.Fatalf("check of a concurrency policy = %d %q, want 0 with a lease_id", code, answer)
	}
	if code, _ := lease(); code != 1 {
		t.Fatalf("second check with the lease held: exit %d, want 1", code)
	}
	if code, out := lease("--release", held.LeaseID); code != 0 || !strings.Contains(out, `"remaining":1`) {
		t.Fatalf("check --release = %d %q, want 0 with remaining 1", code, out)
	}
	if code, _ := lease(); code != 0 {
		t.Fatalf("check after the release: exit %d, want 0", code)
	}
	var out, errOut bytes.Buffer
	args := []string{"check", "--url", s.url, "--policy", "nope", "--subject", "bob"}
	if code := exitCode(run(context.Background(), args, &out, &errOut), &errOut); code != 2 || !strings.Contains(errOut.String(), "404") {
		t.Errorf("check --policy nope = %d, stderr %q; want 2 naming the 404", code, errOut.String())
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := exitCode(run(context.Background(), []string{"check", "--url", s.url, "--policy", "demo", "--subject", "bob"}, &out, &errOut), &errOut); code != 2 {
		t.Errorf("check against a stopped server = %d (%s), want 2", code, errOut.String())
	}
}

func TestServeRefuses(t *testing.T) {
	const policies = `
server: { listen: "127.0.0.1:0" }
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
`
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		want       string
	}{
		{"envoy without rules files", policies + "envoy:\n  listen: 127.0.0.1:8081\n  configs: [ratelimit/*.yaml]\n", nil,
			"line 6): " /* the config's envoy.configs line, then the pattern */},
		{"redis password", policies + "store:\n  type: redis\n  redis: {url: redis://127.0.0.1:6379/0, password_env: SLUICE_TEST_REDIS_PW}\n", map[string]string{"SLUICE_TEST_REDIS_PW": ""},
			`store.redis.password_env: "SLUICE_TEST_REDIS_PW": environment variable SLUICE_TEST_REDIS_PW is not set or empty (line 6)`},
		{"missing secret", policies + "subjects:\n  hmac_keys: [{id: k1, secret_env: SLUICE_TEST_HMAC_K1}]\n", map[string]string{"SLUICE_TEST_HMAC_K1": ""},
			`subjects.hmac_keys[0].secret_env: "SLUICE_TEST_HMAC_K1": environment variable SLUICE_TEST_HMAC_K1 is not set or empty (line 5)`},
		{"short secret", policies + "subjects:\n  hmac_keys: [{id: k1, secret_env: SLUICE_TEST_HMAC_K1}]\n", map[string]string{"SLUICE_TEST_HMAC_K1": "short"},
			"environment variable SLUICE_TEST_HMAC_K1 holds 5 bytes: an HMAC secret must be at least 16"},
		{"bad config", "policies: [{id: demo, algorithm: leaky, limit: 3, window: 10s}]\n", nil,
			`policies[0].algorithm: "leaky": must be one of`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			err := run(context.Background(), []string{"serve", "-c", writeConfig(t, tc.yaml)}, &out, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("serve = %v, want an error containing %q", err, tc.want)
			}
			if code := exitCode(err, io.Discard); code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
		})
	}
}

func TestServeWithHMACKey(t *testing.T) {
	t.Setenv("SLUICE_TEST_HMAC_K1", strings.Repeat("s", 32))
	s := startServe(t, "-c", writeConfig(t, demoConfig+"subjects:\n  hmac_keys: [{id: k1, secret_env: SLUICE_TEST_HMAC_K1}]\n"))
	resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"carol"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("check: status %d, want 200", resp.StatusCode)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if logs := s.logs.String(); strings.Contains(logs, "hmac_keys is not configured") || strings.Contains(logs, strings.Repeat("s", 32)) {
		t.Errorf("serve with a key warned or logged the secret:\n%s", logs)
	}
}

// TestValidateOnePass: the environment's problems (an unset secret_env,
// rules files that do not load) are listed with the file's own (an
// unknown key, a bad duration), one list sorted by line, rather than
// hidden behind them.
func TestValidateOnePass(t *testing.T) {
	cfg := writeConfig(t, `server:
  listen: "127.0.0.1:0"
  bogus: 1
subjects:
  hmac_keys:
    - { id: "k1", secret_env: "SLUICE_TEST_UNSET_K1" }
policies:
  - { id: a, algorithm: fixed_window, limit: 3, window: 8761h }
envoy:
  listen: "127.0.0.1:0"
  configs: ["missing/*.yaml"]
`)
	var out, errOut bytes.Buffer
	if code := exitCode(run(context.Background(), []string{"validate", "-c", cfg}, &out, &errOut), &errOut); code != 1 {
		t.Fatalf("validate exited %d, want 1; stderr %q", code, errOut.String())
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "sluice: "))
	}
	want := []string{
		cfg + ": server.bogus: unknown key: must be one of listen, tls, auth, decision_timeout (line 3)",
		cfg + `: subjects.hmac_keys[0].secret_env: "SLUICE_TEST_UNSET_K1": environment variable SLUICE_TEST_UNSET_K1 is not set or empty (line 6)`,
		cfg + `: policies[0].window: "8761h": must be between 1ms and 365 days (8760h) (line 8)`,
		"envoy.configs (" + cfg + " line 11): " + filepath.Join(filepath.Dir(cfg), "missing/*.yaml") + ": no rules file matches",
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("validate's problems (-want +got):\n%s", diff)
	}
}

func TestValidate(t *testing.T) {
	bad := writeConfig(t, `# sluice.yaml
server:
  listen: "127.0.0.1:8080"
policies:
  - id: login
    algorithm: leaky_bucket
    limit: 5
    window: 1m
`)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"validate", "--config", bad}, &out, &errOut)
	if code := exitCode(err, &errOut); code == 0 {
		t.Fatalf("validate of an unknown algorithm exited 0")
	}
	want := bad + `: policies[0].algorithm: "leaky_bucket": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 6)`
	if got := strings.TrimSpace(errOut.String()); got != "sluice: "+want {
		t.Errorf("validate stderr = %q, want %q", got, "sluice: "+want)
	}
	if out.Len() != 0 {
		t.Errorf("validate of a bad config printed %q on stdout", out.String())
	}

	out.Reset()
	errOut.Reset()
	good := writeConfig(t, demoConfig)
	if err := run(context.Background(), []string{"validate", "-c", good}, &out, &errOut); err != nil || out.String() != "ok\n" {
		t.Errorf("validate of a good config = %v, stdout %q; want nil, ok", err, out.String())
	}

	out.Reset()
	errOut.Reset()
	proxy := writeConfig(t, demoConfig+"proxy:\n  upstream: http://127.0.0.1:9000\n  routes: [{match: {path_prefix: /}, policies: [demo]}]\n")
	if err := run(context.Background(), []string{"validate", "-c", proxy}, &out, &errOut); err != nil || out.String() != "ok\n" || errOut.Len() != 0 {
		t.Errorf("validate with a proxy section = %v, stdout %q, stderr %q; want ok and no warning", err, out.String(), errOut.String())
	}

	// With an envoy section, validate reads the rules files too, relative
	// to the config file.
	out.Reset()
	errOut.Reset()
	envoy := writeConfig(t, demoConfig+"envoy:\n  listen: 127.0.0.1:8081\n  configs: [ratelimit/*.yaml]\n")
	rules := filepath.Join(filepath.Dir(envoy), "ratelimit", "api.yaml")
	if err := os.MkdirAll(filepath.Dir(rules), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"validate", "-c", envoy}, &out, &errOut); err != nil || out.String() != "ok\n" || errOut.Len() != 0 {
		t.Errorf("validate with an envoy section = %v, stdout %q, stderr %q; want ok", err, out.String(), errOut.String())
	}
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	err = run(context.Background(), []string{"validate", "-c", envoy}, &out, &errOut)
	want = rules + `: descriptors[0].rate_limit.unit: "fortnight": must be one of second, minute, hour, day, week, month, year`
	if exitCode(err, &errOut) != 1 || !strings.Contains(errOut.String(), want) || !strings.Contains(errOut.String(), "(line 4)") {
		t.Errorf("validate with a bad rules file: stderr %q, want exit 1 and %q with its line", errOut.String(), want)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		stdout   string // a substring
		stderr   string // a substring
		noStdout bool
	}{
		{args: nil, code: 2, stderr: "no command given"},
		{args: []string{"frobnicate"}, code: 2, stderr: `unknown command "frobnicate"`},
		{args: []string{"serve", "--port", "80"}, code: 2, stderr: "flag provided but not defined: -port"},
		{args: []string{"serve", "extra"}, code: 2, stderr: `unexpected argument "extra"`},
		{args: []string{"serve", "--log-level", "loud"}, code: 2, stderr: `--log-level "loud"`},
		{args: []string{"validate"}, code: 2, stderr: "validate needs --config FILE"},
		{args: []string{"validate", "-c"}, code: 2, stderr: "flag needs an argument: -c"},
		{args: []string{"validate", "-c", "/nonexistent/sluice.yaml"}, code: 1, stderr: "no such file"},
		{args: []string{"check", "--policy", "demo"}, code: 2, stderr: "check needs --policy and --subject"},
		{args: []string{"check", "--cost", "many"}, code: 2, stderr: "invalid value"},
		{args: []string{"version", "now"}, code: 2, stderr: "version takes no arguments"},
		{args: []string{"version"}, code: 0, stdout: "sluice "},
		{args: []string{"version"}, code: 0, stdout: "\ncommit: "},
		{args: []string{"version"}, code: 0, stdout: "\nmodified: "},
		{args: []string{"help"}, code: 0, stdout: "sluice serve [--config FILE]"},
		{args: []string{"--help"}, code: 0, stdout: "sluice validate [--strict] --config FILE"},
		{args: []string{"check", "-h"}, code: 0, stdout: "-subject"},
		{args: []string{"help", "serve"}, code: 0, stdout: "-log-format"},
		{args: []string{"help", "validate"}, code: 0, stdout: "Usage: sluice validate [--strict] --config FILE"},
		{args: []string{"help", "check"}, code: 0, stdout: "-token-env"},
		{args: []string{"help", "version"}, code: 0, stdout: "sluice version"},
		{args: []string{"help", "frobnicate"}, code: 2, stderr: `help: unknown command "frobnicate"`},
		{args: []string{"serve", "-h"}, code: 0, stdout: "-log-level"},
		{args: []string{"serve", "--log-format", "xml"}, code: 2, stderr: `--log-format "xml": must be text or json`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := exitCode(run(context.Background(), tc.args, &out, &errOut), &errOut)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errOut.String(), tc.stderr) {
				t.Errorf("sluice %q: exit %d\nstdout: %s\nstderr: %s\nwant exit %d, stdout with %q, stderr with %q", tc.args, code, out.String(), errOut.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		msg  string
	}{
		{nil, 0, ""},
		{errors.New("boom"), 1, "sluice: boom\n"},
		{&exitError{code: 1}, 1, ""},
		{&exitError{code: 2, err: errors.New("check: 503 Service Unavailable")}, 2, "sluice: check: 503 Service Unavailable\n"},
		{fmt.Errorf("wrapped: %w", &usageError{msg: "bad", usage: "Usage: x\n"}), 2, "sluice: bad\n\nUsage: x\n"},
	} {
		var b bytes.Buffer
		if code := exitCode(tc.err, &b); code != tc.code || b.String() != tc.msg {
			t.Errorf("exitCode(%v) = %d, %q; want %d, %q", tc.err, code, b.String(), tc.code, tc.msg)
		}
	}
}

// TestVersionText holds what sluice version prints for the builds a user
// meets: go install …@v1.2.3 (a module version, no vcs stamps), a build in a
// clone with local changes, the container image's -X main.version, and a
// binary without build information.
func TestVersionText(t *testing.T) {
	clone := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: "v0.0.0-20261204200000-ba3281d0c1a2+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "ba3281d0c1a2b3c4d5e6f708192a3b4c5d6e7f80"},
			{Key: "vcs.time", Value: "2026-12-04T20:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	for _, tc := range []struct {
		name    string
		ldflags stamps
		bi      *debug.BuildInfo
		want    string
	}{
		{
			name: "go install at a version",
			bi:   &debug.BuildInfo{Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: "v1.2.3"}},
			want: "sluice v1.2.3\ncommit: unknown\nmodified: unknown\n",
		},
		{
			name: "a clone with local changes",
			bi:   clone,
			want: "sluice v0.0.0-20261204200000-ba3281d0c1a2+dirty\ncommit: ba3281d0c1a2b3c4d5e6f708192a3b4c5d6e7f80\nmodified: true\n",
		},
		{
			name:    "ldflags' version wins",
			ldflags: stamps{version: "v1.2.4"},
			bi:      clone,
			want:    "sluice v1.2.4\ncommit: ba3281d0c1a2b3c4d5e6f708192a3b4c5d6e7f80\nmodified: true\n",
		},
		{
			name:    "ldflags' stamps win over go build's",
			ldflags: stamps{"v1.2.5", "0123456789abcdef0123456789abcdef01234567", "false"},
			bi:      clone,
			want:    "sluice v1.2.5\ncommit: 0123456789abcdef0123456789abcdef01234567\nmodified: false\n",
		},
		{
			name:    "ldflags' stamps without vcs stamps (a container, CI)",
			ldflags: stamps{"v1.2.6", "89abcdef0123456789abcdef0123456789abcdef", ""},
			bi:      &debug.BuildInfo{Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: "(devel)"}},
			want:    "sluice v1.2.6\ncommit: 89abcdef0123456789abcdef0123456789abcdef\nmodified: unknown\n",
		},
		{
			name: "no build information",
			want: "sluice unknown\ncommit: unknown\nmodified: unknown\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionText(tc.ldflags, tc.bi); got != tc.want {
				t.Errorf("versionText(%+v, %+v) = %q, want %q", tc.ldflags, tc.bi, got, tc.want)
			}
		})
	}
}

// TestVersionCommand holds the command's output shape: three lines, the
// version, the commit and modified, whatever the test binary's build
// information holds.
func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &errOut); err != nil {
		t.Fatalf("sluice version: %v\nstderr: %s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "sluice ") || lines[0] == "sluice " ||
		!strings.HasPrefix(lines[1], "commit: ") || !strings.HasPrefix(lines[2], "modified: ") {
		t.Errorf("sluice version printed %q, want three lines: sluice VERSION, commit: …, modified: …", out.String())
	}
}
