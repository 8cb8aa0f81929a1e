package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/internal/config"
)

// TestWatchSetRelevant lays files out as a Kubernetes ConfigMap volume
// does (links through ..data) beside other files, and asks which names
// the watcher reacts to.
func TestWatchSetRelevant(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_01_01.1")
	if err := os.MkdirAll(filepath.Join(data, "rules"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"sluice.yaml", "rules/shop.yaml"} {
		if err := os.WriteFile(filepath.Join(data, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"..data": "..2026_01_01.1", "sluice.yaml": "..data/sluice.yaml", "rules": "..data/rules"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &config.Config{Envoy: &config.Envoy{Configs: []string{"rules/*.yaml"}}}
	ws := newWatchSet(filepath.Join(dir, "sluice.yaml"), cfg)
	for name, want := range map[string]bool{
		"sluice.yaml":            true,
		"./sluice.yaml":          true,
		"..data":                 true, // the kubelet's swap
		"rules/shop.yaml":        true,
		"rules/new.yaml":         true, // a new file the glob matches
		"rules/new.yml":          false,
		"sluice.log":             false,
		".sluice.yaml.swp":       false,
		"sluice.yaml~":           false,
		"..2026_01_01.2":         false, // the next version, before ..data points at it
		"rules/sub/deeper.yaml":  false,
		"../elsewhere/sluice.ya": false,
	} {
		if got := ws.relevant(filepath.Join(dir, name)); got != want {
			t.Errorf("relevant(%s) = %v, want %v", name, got, want)
		}
	}
	if len(ws.dirs) != 2 || ws.dirs[0] != dir || ws.dirs[1] != filepath.Join(dir, "rules") {
		t.Errorf("watched directories = %q, want %q and its rules", ws.dirs, dir)
	}
}
