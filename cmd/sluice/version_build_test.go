package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestMakeBuildStamps: make build stamps the binary, so sluice version
// names the version asked for and the clone's commit whatever go build's
// own vcs stamps hold (none in many CI checkouts and containers).
func TestMakeBuildStamps(t *testing.T) {
	redistest.Long(t)
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: make build needs it", tool)
		}
	}
	root := filepath.Join("..", "..")
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	mk := exec.Command("make", "-s", "build", "BIN="+bin, "VERSION=v9.9.9-stamped")
	mk.Dir = root
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	want := regexp.MustCompile(`^sluice v9\.9\.9-stamped\ncommit: ` + strings.TrimSpace(string(head)) + `\nmodified: (true|false)\n$`)
	if err != nil || !want.Match(out) {
		t.Errorf("sluice version of make build = %q, %v; want it to match %q", out, err, want)
	}
}
