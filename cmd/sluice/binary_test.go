package main

// Tests of the built sluice binary, run as an operator runs it: a child
// process with real arguments, exit statuses, stdout, stderr and signals.

import (
	"bytes"
	"context"
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

// TestREADMECommands runs the command blocks of README.md and of the pages
// under docs/ (those marked for this test) as written, against the built-in example started as the
// Quickstart says: "go run ./cmd/sluice" is the built binary, each line
// runs in sh from the repository root, and each exits with the status its
// comment gives (0 without one). The built-in example listens on
// 127.0.0.1:8080, the address the commands name.
func TestREADMECommands(t *testing.T) {
	redistest.Long(t)
	var lines []string
	for _, doc := range docFiles(t) {
		lines = append(lines, readmeCommands(t, readFile(t, doc))...)
	}
	if len(lines) < 8 {
		t.Fatalf("found %d commands in the README's marked blocks, want at least 8: %q", len(lines), lines)
	}
	// The server below is the one the Quickstart's first command starts.
	if readme := readFile(t, filepath.Join("..", "..", "README.md")); !strings.Contains(readme, "```sh\ngo run ./cmd/sluice serve    # run:") {
		t.Fatalf("README.md's Quickstart does not start with go run ./cmd/sluice serve, the server these commands run against")
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

// docFiles are README.md and the pages under docs/, from this package.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join("..", "..", "README.md")}, pages...)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// markedBlocks returns the contents of the ```lang blocks that follow
// each marker comment in doc.
func markedBlocks(t *testing.T, doc, marker, lang string) []string {
	t.Helper()
	var out []string
	for rest := doc; ; {
		i := strings.Index(rest, marker)
		if i < 0 {
			return out
		}
		rest = rest[i:]
		start := strings.Index(rest, "```"+lang+"\n")
		if start < 0 {
			t.Fatalf("a %q marker without a ```%s block after it", marker, lang)
		}
		body := rest[start+len(lang)+4:]
		end := strings.Index(body, "```")
		if end < 0 {
			t.Fatalf("a %q marker's ```%s block is not closed", marker, lang)
		}
		out = append(out, body[:end])
		rest = body[end:]
	}
}

// docRules is the rules file a documented config's envoy.configs glob
// ("ratelimit/*.yaml") finds: the first rule of docs/envoy.md's example.
const docRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
`

// TestREADMEConfigs validates, as sluice validate does, each YAML block of
// README.md and the docs pages marked for it: the configs a new user
// copies first (the server's, a first Redis store) must load. Secrets a
// block names by environment variable are set for it.
func TestREADMEConfigs(t *testing.T) {
	const marker = "<!-- TestREADMEConfigs validates this block -->"
	n := 0
	for _, doc := range docFiles(t) {
		for i, block := range markedBlocks(t, readFile(t, doc), marker, "yaml") {
			n++
			for _, m := range regexp.MustCompile(`secret_env: "?(\w+)`).FindAllStringSubmatch(block, -1) {
				t.Setenv(m[1], "0123456789abcdef0123456789abcdef")
			}
			dir := t.TempDir()
			file := filepath.Join(dir, "sluice.yaml")
			if err := os.WriteFile(file, []byte(block), 0o644); err != nil {
				t.Fatal(err)
			}
			// A block with an envoy: section names rules files beside it.
			if err := os.Mkdir(filepath.Join(dir, "ratelimit"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "ratelimit", "edge.yaml"), []byte(docRules), 0o644); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			if err := run(context.Background(), []string{"validate", "--config", file}, &out, &errOut); err != nil || out.String() != "ok\n" {
				t.Errorf("%s: marked YAML block %d: sluice validate: %v\nstdout: %s\nstderr: %s\nblock:\n%s", doc, i+1, err, out.String(), errOut.String(), block)
			}
		}
	}
	if n < 2 {
		t.Errorf("found %d marked YAML blocks, want at least the README's server config and first Redis config", n)
	}
}

// TestREADMEInstall holds the README's install block to the module it
// installs (the go install and go get lines name go.mod's module path),
// and installs the command the way that line does, from this clone
// (@latest needs a published module; the build is the same): the
// installed sluice version names the commit it was built from.
func TestREADMEInstall(t *testing.T) {
	redistest.Long(t)
	const marker = "<!-- TestREADMEInstall checks this block -->"
	blocks := markedBlocks(t, readFile(t, filepath.Join("..", "..", "README.md")), marker, "sh")
	if len(blocks) != 1 {
		t.Fatalf("README.md has %d install blocks marked for this test, want 1", len(blocks))
	}
	mod := regexp.MustCompile(`(?m)^module (\S+)$`).FindStringSubmatch(readFile(t, filepath.Join("..", "..", "go.mod")))
	if mod == nil {
		t.Fatal("go.mod names no module")
	}
	for _, want := range []string{"go install " + mod[1] + "/cmd/sluice@latest", "go get " + mod[1] + "@latest"} {
		if !strings.Contains(blocks[0], want) {
			t.Errorf("README.md's install block does not say %q:\n%s", want, blocks[0])
		}
	}
	if !strings.HasPrefix(strings.TrimSpace(blocks[0]), "go install ") {
		t.Errorf("README.md's install block starts %q, want the go install line first", blocks[0])
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	gobin := t.TempDir()
	install := exec.Command(goTool, "install", "./cmd/sluice")
	install.Dir = filepath.Join("..", "..")
	install.Env = append(os.Environ(), "GOBIN="+gobin)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install ./cmd/sluice: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(gobin, "sluice"), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice version: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`^sluice \S+\ncommit: ([0-9a-f]{40}|unknown)\nmodified: (true|false|unknown)\n$`).Match(out) {
		t.Errorf("the installed sluice version printed %q, want sluice VERSION, commit: …, modified: …", out)
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
	fixture, _ := filepath.Abs(filepath.Join("..", "..", "internal", "config", "testdata", "invalid", "ten_mistakes.yaml"))
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
