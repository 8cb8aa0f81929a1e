package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/server"
)

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:8080": true,
		"0.0.0.0:8080": false, ":8080": false, "10.0.0.1:8080": false, "[::]:8080": false,
	} {
		if got := server.Loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

var listening = regexp.MustCompile(`msg=listening addr=(http://\S+)`)

// running is a server.Run in the background.
type running struct {
	url  string
	logs *syncBuffer
	stop func() error // cancels Run's context and returns its error
}

// startRun runs the config at path, logging at debug level to logs and
// to the file logFile (when not ""), until the test ends or stop.
func startRun(t *testing.T, path, logFile string) *running {
	t.Helper()
	return startRunWith(t, server.RunOptions{ConfigPath: path}, logFile)
}

// startRunWith is startRun with opts (their Log replaced).
func startRunWith(t *testing.T, opts server.RunOptions, logFile string) *running {
	t.Helper()
	logs := &syncBuffer{}
	var w io.Writer = logs
	if logFile != "" {
		f, err := os.Create(logFile)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		w = io.MultiWriter(f, logs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts.Log = log
	go func() { done <- server.Run(ctx, opts) }()
	var once sync.Once
	var runErr error
	r := &running{logs: logs, stop: func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	})
	waitUntil(t, "the listening line", func() bool {
		select {
		case err := <-done:
			done <- err // for stop
			t.Fatalf("Run returned before listening: %v\n%s", err, logs)
		default:
		}
		m := listening.FindStringSubmatch(logs.String())
		if m != nil {
			r.url = m[1]
		}
		return m != nil
	})
	return r
}

// waitUntil polls ok for at most about 20s: the watcher reacts after a
// quiet period, on a machine that may be busy.
func waitUntil(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for range 400 {
		if ok() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

// check spends one unit of demo, which the debug log records.
func (r *running) check(t *testing.T) {
	t.Helper()
	resp, err := http.Post(r.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"demo","subject":"s"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// saveLikeSed replaces the file at path the way sed -i does: a new file
// beside it, renamed over it.
func saveLikeSed(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "sedX3f9a1")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const watchedConfig = `
server: { listen: "127.0.0.1:0" }
policies:
  - { id: demo, algorithm: fixed_window, limit: %d, window: 1h }
`

// TestWatcherIgnoresOtherFiles runs the server with its debug log in the
// config's directory, as "serve --config sluice.yaml --log-level debug >
// sluice.log" does, and another file there written to: neither is a
// reload nor a log line. Each settled edit of the config is one reload
// attempt, one log line and one count, a bad one included.
func TestWatcherIgnoresOtherFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, watchedConfig, 3), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, path, filepath.Join(dir, "sluice.log"))
	notes := filepath.Join(dir, "notes.txt")
	for i := range 5 {
		r.check(t) // a debug line into sluice.log
		if err := os.WriteFile(notes, fmt.Appendf(nil, "note %d\n", i), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	saveLikeSed(t, path, fmt.Sprintf(watchedConfig, 4))
	waitUntil(t, "generation 2", func() bool { return configStatus(t, r).Generation == 2 })
	r.check(t)
	saveLikeSed(t, path, fmt.Sprintf(watchedConfig, 0)) // limit 0: refused
	waitUntil(t, "a failed reload", func() bool { return metricValue(t, r, `sluice_config_reloads_total{result="failure"}`) == "1" })
	r.check(t)
	saveLikeSed(t, path, fmt.Sprintf(watchedConfig, 5))
	waitUntil(t, "generation 3", func() bool { return configStatus(t, r).Generation == 3 })

	logs := r.logs.String()
	if ok, failed := metricValue(t, r, `sluice_config_reloads_total{result="success"}`), metricValue(t, r, `sluice_config_reloads_total{result="failure"}`); ok != "2" || failed != "1" {
		t.Errorf("sluice_config_reloads_total after two good edits and a bad one: success %s, failure %s; want 2 and 1", ok, failed)
	}
	for msg, want := range map[string]int{`msg="config reloaded"`: 2, `msg="config reload failed`: 1} {
		if n := strings.Count(logs, msg); n != want {
			t.Errorf("%d lines with %s, want %d:\n%s", n, msg, want, logs)
		}
	}
	for _, name := range []string{"sluice.log", "notes.txt", "sedX3f9a1"} {
		if strings.Contains(logs, name) {
			t.Errorf("the log names %s, which is not a config file:\n%s", name, logs)
		}
	}
}

var proxyListening = regexp.MustCompile(`msg="proxy listening" addr=(http://\S+)`)

const fallbackConfig = `
server: { listen: "127.0.0.1:0" }
store: { type: redis, redis: { url: "redis://%s/0" } }
policies:
  - { id: edge, algorithm: fixed_window, limit: 10, window: 1h, failure_mode: local }
  - { id: other, algorithm: fixed_window, limit: %d, window: 1h }
proxy:
  listen: "127.0.0.1:0"
  upstream: "%s"
  local_share: 0.2
  routes:
    - { match: { path_prefix: / }, policies: [edge], subject: ip }
`

// TestLocalFallbackSurvivesReload runs the proxy over a Redis nobody
// listens on: the local fallback (a fifth of 10: 2) decides, and what it
// counted is still counted after a reload, which no longer builds a
// fallback store of its own.
func TestLocalFallbackSurvivesReload(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close() // refused from now on
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, fallbackConfig, down, 1, up.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, path, "")
	m := proxyListening.FindStringSubmatch(r.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", r.logs)
	}
	get := func() int {
		t.Helper()
		resp, err := http.Get(m[1] + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, want := range []int{200, 200, 429} {
		if got := get(); got != want {
			t.Fatalf("request %d with Redis down = %d, want %d (the local fallback admits 2)", i+1, got, want)
		}
	}
	saveLikeSed(t, path, fmt.Sprintf(fallbackConfig, down, 2, up.URL))
	waitUntil(t, "generation 2", func() bool { return configStatus(t, r).Generation == 2 })
	if got := get(); got != 429 {
		t.Errorf("after a reload = %d, want 429: the fallback's counts carry over", got)
	}
}
