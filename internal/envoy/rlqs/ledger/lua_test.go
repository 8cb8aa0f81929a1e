package ledger

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLuaPortsItsTwins holds claim.lua to the habit of redisstore/lua
// (redisstore's TestScriptFilesPortTheirTwins): its first line names the
// Go files it ports, every function's doc comment reads "NAME ports
// TARGET" with TARGET a function or method (Type.Method) of this
// package, but for the shim's few (withoutTwin). (Lua defines a local
// before its callers, so the order is not Go's.)
func TestLuaPortsItsTwins(t *testing.T) {
	first, _, _ := strings.Cut(code, "\n")
	for _, f := range []string{"internal/envoy/rlqs/ledger/ledger.go", "memory.go"} {
		if !strings.Contains(first, f) {
			t.Errorf("claim.lua's first line %q does not name %s", first, f)
		}
	}
	withoutTwin := []string{"bindLibrary", "entriesFormat", "decodeEntries", "unpackEntries", "keepIf", "live", "notOf", "filterAll",
		"writes", "writeAll", "number", "amounts", "redisTime", "keepFor", "readEntries", "ledger"}
	fn := regexp.MustCompile(`^local function ([A-Za-z_]\w*)\(`)
	ports := regexp.MustCompile(`^-- ([A-Za-z_]\w*) ports ([A-Za-z_][\w.]*[A-Za-z_0-9])`)
	doc := map[string]string{}
	var missing, targets []string
	for _, line := range strings.Split(code, "\n") {
		if m := ports.FindStringSubmatch(line); m != nil {
			doc[m[1]] = m[2]
		}
		if m := fn.FindStringSubmatch(line); m != nil {
			if tg := doc[m[1]]; tg == "" {
				missing = append(missing, m[1])
			} else {
				targets = append(targets, tg)
			}
		}
	}
	if !slices.Equal(missing, withoutTwin) {
		t.Errorf("claim.lua's functions without a twin: %q, want %q", missing, withoutTwin)
	}
	var goFuncs []string
	re := regexp.MustCompile(`(?m)^func (?:\(\w+ \*?(\w+)\) )?(\w+)\(`)
	for _, f := range []string{"ledger.go", "memory.go"} {
		src, err := os.ReadFile(filepath.Join(".", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			name := m[2]
			if m[1] != "" {
				name = m[1] + "." + m[2]
			}
			goFuncs = append(goFuncs, name)
		}
	}
	for _, tg := range targets {
		if !slices.Contains(goFuncs, tg) {
			t.Errorf("claim.lua ports %s, which is no function of ledger.go or memory.go", tg)
		}
	}
}
