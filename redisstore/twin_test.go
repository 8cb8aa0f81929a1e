package redisstore

// The Lua functions' Go twins, by name and order (TestScriptFilesPortTheirTwins).

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// withoutTwin are the Lua functions that port no Go function yet, by
// file: the I/O shim's and the codec's (issue 31's debt). A function
// leaves this list when it gains its twin, and none joins it: every other
// function's doc comment reads "NAME ports TARGET", TARGET a Go function
// or method (Type.Method) of the engine or of this package.
var withoutTwin = map[string][]string{
	"params.lua":      {"bindLibrary", "fdiv", "quo", "rem"}, // Lua's own: binding the globals, integer division on doubles
	"codec.lua":       {"int", "fmt", "idx", "encodeFields", "encodeState", "badField", "fieldCorrupt", "decodeFields", "decodeState"},
	"sliding_log.lua": {"slidingLogChecked", "slidingLogEntry", "slidingLogLive"},
	"concurrency.lua": {"concurrencyEntry"},
	"engine.lua":      {"absentOf"},
	"args.lua":        {"redisTime"},
	"records.lua":     {"decodeChecked", "ahead", "px"},
	"dedupe.lua":      {"hdel"},
	"carry.lua":       {"carriedEntries", "carryOver"},
}

// luaFunctions returns the functions of a Lua file in order, each with
// the Go function its doc comment says it ports ("" for none).
func luaFunctions(src string) (names, targets []string) {
	fn := regexp.MustCompile(`^local function ([A-Za-z_]\w*)\(`)
	ports := regexp.MustCompile(`^-- ([A-Za-z_]\w*) ports (?:the part of )?([A-Za-z_][\w.]*[A-Za-z_0-9])`)
	doc := map[string]string{}
	for _, line := range strings.Split(src, "\n") {
		if m := ports.FindStringSubmatch(line); m != nil {
			doc[m[1]] = m[2]
		}
		if m := fn.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
			targets = append(targets, doc[m[1]])
		}
	}
	return names, targets
}

// goFuncs returns the functions and methods (Type.Method) of the Go files
// in dir, non-test, in the order of each file, by file.
func goFuncs(t *testing.T, dir string) map[string][]string {
	re := regexp.MustCompile(`(?m)^func (?:\(\w+ \*?(\w+)(?:\[[^]]*\])?\) )?(\w+)[\[(]`)
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			name := m[2]
			if m[1] != "" {
				name = m[1] + "." + m[2]
			}
			out[filepath.Base(f)] = append(out[filepath.Base(f)], name)
		}
	}
	return out
}

// checkTwinsByName holds each Lua function to its Go twin by name
// (withoutTwin lists those that have none yet) and each algorithm file's
// functions to its Go twin's order. TestScriptFilesPortTheirTwins runs it.
func checkTwinsByName(t *testing.T) {
	algo := goFuncs(t, "../internal/engine/algorithm")
	here := goFuncs(t, ".")
	all := map[string]bool{}
	for _, m := range []map[string][]string{algo, here} {
		for _, fs := range m {
			for _, f := range fs {
				all[f] = true
			}
		}
	}
	for _, name := range scriptFiles {
		src, _ := luaFiles.ReadFile("lua/" + name)
		names, targets := luaFunctions(string(src))
		var missing []string
		for i, n := range names {
			if targets[i] == "" {
				missing = append(missing, n)
			} else if !all[targets[i]] {
				t.Errorf("%s: %s ports %s, which is no Go function here or in the engine", name, n, targets[i])
			}
		}
		if !slices.Equal(missing, withoutTwin[name]) {
			t.Errorf("%s: functions without a twin %q, want %q", name, missing, withoutTwin[name])
		}
		twin := algo[strings.TrimSuffix(name, ".lua")+".go"]
		var inLua, inGo []string
		for _, tg := range targets {
			if slices.Contains(twin, tg) && !slices.Contains(inLua, tg) {
				inLua = append(inLua, tg)
			}
		}
		for _, g := range twin {
			if slices.Contains(inLua, g) {
				inGo = append(inGo, g)
			}
		}
		if !slices.Equal(inLua, inGo) {
			t.Errorf("%s ports %q in this order, its twin defines them in the order %q", name, inLua, inGo)
		}
	}
}
