package servetest_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// TestServe builds the binary, serves a config on a free port, reads the
// address from the start line, asks the server, and stops it cleanly.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("server: { listen: \"127.0.0.1:0\" }\npolicies:\n  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := servetest.Start(servetest.Binary(t), servetest.Options{LogPath: filepath.Join(dir, "serve.log")}, "serve", "-c", cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(p.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz = %s, want 200", resp.Status)
	}
	if err := p.Stop(20 * time.Second); err != nil {
		t.Errorf("Stop = %v, want a clean exit after SIGTERM\n%s", err, p.Logs())
	}
	log, err := os.ReadFile(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), p.StartLine) || p.ProxyURL() != "" || p.RLSAddr() != "" {
		t.Errorf("log file %q, proxy %q, rls %q: want the start line, no proxy, no rls", log, p.ProxyURL(), p.RLSAddr())
	}
}

// TestStartReportsAnEarlyExit: a config serve refuses ends the wait with
// the process's own reason, not a timeout.
func TestStartReportsAnEarlyExit(t *testing.T) {
	_, err := servetest.Start(servetest.Binary(t), servetest.Options{}, "serve", "-c", filepath.Join(t.TempDir(), "missing.yaml"))
	if err == nil || !strings.Contains(err.Error(), "exited before listening") {
		t.Errorf("Start with a missing config = %v, want an error saying it exited before listening", err)
	}
}
