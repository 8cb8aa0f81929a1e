package main

// Tests of the built sluice binary, run as an operator runs it: a child
// process with real arguments, exit statuses, stdout, stderr and signals.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// sluiceBinary is cmd/sluice, built once per test run by servetest with
// the Dockerfile's build settings (CGO_ENABLED=0, -trimpath), so that the
// deploy test's build of the same packages finds them compiled.
func sluiceBinary(t *testing.T) string { return servetest.Binary(t) }

// TestMain removes the binary sluiceBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// runBinary runs the binary with args in dir and returns its stdout,
// stderr and exit status.
func runBinary(t *testing.T, dir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(sluiceBinary(t), args...)
	cmd.Dir = dir
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("sluice %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}

// startChild runs the binary with args (serve …) in dir and waits for
// its start line. The process is stopped by its PID at the end.
func startChild(t *testing.T, dir string, args ...string) *servetest.Process {
	t.Helper()
	p, err := servetest.Start(sluiceBinary(t), servetest.Options{Dir: dir}, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(20 * time.Second) })
	return p
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestREADMECommands runs the README's command blocks (those marked for
// this test) as written, against the built-in example started as the
// Quickstart says: "go run ./cmd/sluice" is the built binary, each line
// runs in sh from the repository root, and each exits with the status its
// comment gives (0 without one). The built-in example listens on
// 127.0.0.1:8080, the address the commands name.
func TestREADMECommands(t *testing.T) {
	redistest.Long(t)
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := readmeCommands(t, string(readme))
	if len(lines) < 8 {
		t.Fatalf("found %d commands in the README's marked blocks, want at least 8: %q", len(lines), lines)
	}
	if ln, err := net.Listen("tcp", "127.0.0.1:8080"); err != nil {
		t.Skipf("127.0.0.1:8080, the built-in example's address the README's commands name, is taken on this machine: %v", err)
	} else {
		ln.Close()
	}
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	s := startChild(t, root, "serve")
	if s.URL != "http://127.0.0.1:8080" {
		t.Fatalf("the built-in example listens on %s, want http://127.0.0.1:8080 as the README says", s.URL)
	}
	bin := sluiceBinary(t)
	seen := map[string]bool{}
	for _, line := range lines {
		cmdline, comment, _ := strings.Cut(line, "#")
		want := 0
		if m := regexp.MustCompile(`^\s*exit (\d+)`).FindStringSubmatch(comment); m != nil {
			want, _ = strconv.Atoi(m[1])
		}
		cmdline = strings.ReplaceAll(cmdline, "go run ./cmd/sluice", bin)
		if f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(cmdline), bin)); len(f) > 0 {
			seen[f[0]] = true
		}
		cmd := exec.Command("sh", "-c", cmdline)
		cmd.Dir = root
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if code != want {
			t.Errorf("README command %q: exit %d, want %d\nstdout: %s\nstderr: %s", line, code, want, out.String(), errOut.String())
		}
		if strings.Contains(line, "--policy nope") && !strings.Contains(out.String()+errOut.String(), "the policies are") {
			t.Errorf("README command %q: the unknown policy's answer lists no known policies:\n%s%s", line, out.String(), errOut.String())
		}
	}
	for _, c := range []string{"check", "validate", "bench", "simulate", "version"} {
		if !seen[c] {
			t.Errorf("the README's command blocks never run sluice %s", c)
		}
	}
}

// readmeCommands returns the lines of the ```sh blocks that follow the
// marker comment naming TestREADMECommands.
func readmeCommands(t *testing.T, readme string) []string {
	t.Helper()
	var out []string
	const marker = "<!-- TestREADMECommands runs this block"
	for rest := readme; ; {
		i := strings.Index(rest, marker)
		if i < 0 {
			return out
		}
		rest = rest[i:]
		start := strings.Index(rest, "```sh\n")
		end := strings.Index(rest[start+6:], "```")
		if start < 0 || end < 0 {
			t.Fatalf("a TestREADMECommands marker without a ```sh block after it")
		}
		for _, l := range strings.Split(rest[start+6:start+6+end], "\n") {
			if strings.TrimSpace(l) != "" {
				out = append(out, l)
			}
		}
		rest = rest[start+6+end:]
	}
}

// TestValidateBinary: ten independent mistakes are ten lines on stderr
// and exit 1; no --config is one line and the command's own usage, not
// the whole help.
func TestValidateBinary(t *testing.T) {
	fixture, _ := filepath.Abs(filepath.Join("..", "..", "internal", "server", "config", "testdata", "invalid", "ten_mistakes.yaml"))
	stdout, stderr, code := runBinary(t, t.TempDir(), "validate", "--config", fixture)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if code != 1 || stdout != "" || len(lines) != 10 {
		t.Fatalf("sluice validate ten_mistakes.yaml: exit %d, stdout %q, %d lines on stderr, want exit 1 and 10:\n%s", code, stdout, len(lines), stderr)
	}
	last := 0
	for _, l := range lines {
		m := regexp.MustCompile(`^sluice: \S+ten_mistakes\.yaml: \S+: .* \(line (\d+)\)$`).FindStringSubmatch(l)
		if m == nil {
			t.Errorf("line %q does not read sluice: FILE: FIELD: … (line N)", l)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		if n < last {
			t.Errorf("line %q comes after one at line %d: not sorted", l, last)
		}
		last = n
	}

	stdout, stderr, code = runBinary(t, t.TempDir(), "validate")
	if code != 2 || stdout != "" || stderr != "sluice: validate needs --config FILE\n\nUsage: "+validateSynopsis+"\n" {
		t.Errorf("sluice validate without --config: exit %d, stdout %q, stderr %q; want exit 2, the reason and validate's usage only", code, stdout, stderr)
	}
}

// TestServeEnvoyOnlyBinary: a config with only an envoy section (and a
// server address) starts; the check API answers for the rules files'
// policies; the start line and /v1/config name every address and where
// it came from.
func TestServeEnvoyOnlyBinary(t *testing.T) {
	dir := t.TempDir()
	rules, err := os.ReadFile(filepath.Join("..", "..", "deploy", "ratelimit", "edge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("server: { listen: \"127.0.0.1:0\" }\nenvoy:\n  listen: \"127.0.0.1:0\"\n  configs: [\"edge.yaml\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runBinary(t, dir, "validate", "--config", cfg); code != 0 {
		t.Fatalf("sluice validate of an envoy-only config: exit %d\n%s", code, stderr)
	}
	s := startChild(t, dir, "serve", "--config", cfg)
	if !strings.Contains(s.StartLine, "addr_from=server.listen") || !strings.Contains(s.StartLine, "envoy_addr=127.0.0.1:") {
		t.Errorf("start line %q, want the check API's address from server.listen and the envoy address", s.StartLine)
	}
	var status struct {
		Listen []struct{ Service, Addr, Source string } `json:"listen"`
	}
	if err := json.Unmarshal([]byte(getBody(t, s.URL+"/v1/config")), &status); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(status.Listen); got != "[{check_api 127.0.0.1:0 server.listen} {envoy 127.0.0.1:0 envoy.listen}]" {
		t.Errorf("/v1/config listen = %s, want the check API and envoy with their fields", got)
	}
	// Unknown in the config, the check API names the policies it has:
	// the rules files'.
	stdout, _, code := runBinary(t, dir, "check", "--url", s.URL, "--policy", "nope", "--subject", "a")
	if code != 2 || !strings.Contains(stdout, "the policies are") || !strings.Contains(stdout, "edge") {
		t.Errorf("sluice check --policy nope on an envoy-only server: exit %d, %s; want 2 and the rules' policies named", code, stdout)
	}
}

// TestReloadLogsOnceBinary edits the config the way sed -i does (a new
// file renamed over the old), twice with a different mistake each time,
// each followed by a SIGHUP of the same files: each attempt counts one
// failure, each distinct failure is one ERROR line, a SIGHUP of the same
// files logs none, and one edit causes one attempt (the SIGHUP after it,
// an attempt of its own, closes the count).
func TestReloadLogsOnceBinary(t *testing.T) {
	if _, err := exec.LookPath("sed"); err != nil {
		t.Fatalf("sed is not installed: %v", err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("server:\n  listen: \"127.0.0.1:0\"\npolicies:\n  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startChild(t, dir, "serve", "--config", cfg)
	failures := func() string {
		for _, l := range strings.Split(getBody(t, s.URL+"/metrics"), "\n") {
			if v, ok := strings.CutPrefix(l, `sluice_config_reloads_total{result="failure"} `); ok {
				return v
			}
		}
		return ""
	}
	errorLines := func() int { return strings.Count(s.Logs(), `level=ERROR msg="config reload failed`) }
	waitFailures := func(want string) {
		t.Helper()
		for range 600 { // a bound on a loaded machine, not a threshold
			if failures() == want {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("sluice_config_reloads_total{result=\"failure\"} = %s, want %s\n%s", failures(), want, s.Logs())
	}
	sed := func(expr string) {
		t.Helper()
		if out, err := exec.Command("sed", "-i", expr, cfg).CombinedOutput(); err != nil {
			t.Fatalf("sed -i %s: %v\n%s", expr, err, out)
		}
	}
	// lastTrigger is what set off the last reload attempt, as /v1/config
	// tells it.
	lastTrigger := func() string {
		var st struct {
			LastReload *struct{ Trigger string } `json:"last_reload"`
		}
		if err := json.Unmarshal([]byte(getBody(t, s.URL+"/v1/config")), &st); err != nil || st.LastReload == nil {
			return ""
		}
		return st.LastReload.Trigger
	}
	// sighup sends SIGHUP and waits until its reload attempt is over. A
	// SIGHUP also takes the files' fingerprint: no file event queued
	// before it can cause an attempt after it, so the counts read then
	// are final for everything done before.
	sighup := func() {
		t.Helper()
		if err := s.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for range 600 { // a bound on a loaded machine, not a threshold
			if lastTrigger() == "signal" {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no reload attempt by SIGHUP within 30s\n%s", s.Logs())
	}
	sed("s/limit: 3/limit: three/")
	waitFailures("1")
	sighup() // an attempt of its own: any further attempt of the edit's would come before it
	if n, f := errorLines(), failures(); n != 1 || f != "2" {
		t.Errorf("after one bad edit and a SIGHUP of the same files: %d ERROR lines, %s failures counted; want 1 and 2\n%s", n, f, s.Logs())
	}
	sed("s/window: 1h/window: 1 hour/")
	waitFailures("3")
	sighup()
	if n, f := errorLines(), failures(); n != 2 || f != "4" {
		t.Errorf("after two distinct bad edits and a SIGHUP after each: %d ERROR lines, %s failures counted; want 2 and 4\n%s", n, f, s.Logs())
	}
}
