package main

import (
	"bytes"
	"go/build"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxCommandLines bounds the non-test lines of cmd/sluice: the command
// keeps flags, exit codes and output; internal/wiring builds what runs.
// 1020 since the override command names a subject a fourth way (rlqs:
// --rlqs-domain, --bucket), whose checks are flags.
const maxCommandLines = 1020

// TestCommandKeepsFlagsAndOutput holds cmd/sluice to flags and output
// (DESIGN.md, Layers): its own files import no store and no part of the
// engine (internal/wiring builds stores, Limiters and simulations for
// it), and they stay within maxCommandLines lines.
func TestCommandKeepsFlagsAndOutput(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/sluicehq/sluice/"
	for _, imp := range pkg.Imports {
		for _, banned := range []string{"memstore", "redisstore", "internal/engine"} {
			if imp == module+banned || strings.HasPrefix(imp, module+banned+"/") {
				t.Errorf("cmd/sluice imports %s: a command builds no store and runs no engine itself; go through internal/wiring", imp)
			}
		}
	}
	lines := 0
	for _, name := range pkg.GoFiles {
		src, err := os.ReadFile(filepath.Join(pkg.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		lines += bytes.Count(src, []byte("\n"))
	}
	if lines > maxCommandLines {
		t.Errorf("cmd/sluice has %d non-test lines in %d files, want at most %d: move what is not flags or output to internal/wiring or internal/simulate", lines, len(pkg.GoFiles), maxCommandLines)
	}
}
