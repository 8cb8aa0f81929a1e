package redisstore

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// TestLuaConstants holds every named constant of the script equal to its Go
// twin: the bounds of internal/engine/algorithm, the algorithm kinds, the fields
// each state keeps, and the argument and reply layout redisstore.go sends
// and reads. A constant on one side only fails too.
func TestLuaConstants(t *testing.T) {
	want := map[string]int64{
		"MIN_WINDOW":            algorithm.MinWindow,
		"MAX_WINDOW":            algorithm.MaxWindow,
		"MAX_LEASE_TTL":         algorithm.MaxLeaseTTL,
		"MAX_PERIOD":            algorithm.MaxPeriod,
		"MAX_LIMIT":             algorithm.MaxLimit,
		"MAX_SLIDING_LOG_LEN":   algorithm.MaxSlidingLogLen,
		"MAX_CONCURRENCY_LIMIT": algorithm.MaxConcurrencyLimit,
		"MAX_EXACT":             algorithm.MaxExact,
		"KIND_FIXED_WINDOW":     int64(algorithm.KindFixedWindow),
		"KIND_SLIDING_LOG":      int64(algorithm.KindSlidingLog),
		"KIND_SLIDING_WINDOW":   int64(algorithm.KindSlidingWindow),
		"KIND_TOKEN_BUCKET":     int64(algorithm.KindTokenBucket),
		"KIND_GCRA":             int64(algorithm.KindGCRA),
		"KIND_CONCURRENCY":      int64(algorithm.KindConcurrency),
		"KIND_FIXED_WINDOW_END": int64(algorithm.KindFixedWindowEnd),
		"KIND_FIXED_PERIOD":     int64(algorithm.KindFixedPeriod),
		"ARGV_COST":             argvCost,
		"ARGV_NOW":              argvNow,
		"ARGV_MAX_REGRESSION":   argvMaxRegression,
		"ARGV_OP":               argvOp,
		"ARGV_ID":               argvID,
		"ARGV_DEDUPE_TTL":       argvDedupeTTL,
		"ARGV_DEDUPE_MAX":       argvDedupeMax,
		"ARGV_LEASE":            argvLease,
		"ARGV_CARRY":            argvCarry,
		"ARGV_HOLD":             argvHold,
		"ARGV_POLICIES":         argvPolicies,
		"ARGV_PER_POLICY":       argvPerPolicy,
		"REPLY_PER_POLICY":      replyPerPolicy,
		"CARRY_PER_POLICY":      carryPerPolicy,
		"REPLY_ABSENT":          replyAbsent,
		"DECISION_SIZE":         replyPerPolicy, // the reply carries the engine's decisions as they are
		"STATE_BINARY":          StateBinary,
		"MAX_GRACE":             maxGrace,
		"MAX_DEDUPE_TTL":        maxDedupeTTL,
		"MAX_DEDUPE_IDS":        maxDedupeIDs,
	}
	got := map[string]int64{}
	def := regexp.MustCompile(`(?m)^local ([A-Z][A-Z0-9_]*) = (-?\d+)`)
	for _, m := range def.FindAllStringSubmatch(decideLua, -1) {
		v, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			t.Fatalf("local %s = %s: %v", m[1], m[2], err)
		}
		if _, dup := got[m[1]]; dup {
			t.Errorf("the script defines %s twice", m[1])
		}
		got[m[1]] = v
	}
	// args.lua's LAYOUT table holds the argument and reply layout and its
	// bounds as fields, one a line, named as the constants would be.
	layout := regexp.MustCompile(`(?s)\nlocal LAYOUT = \{\n(.*?)\n\}`).FindStringSubmatch(decideLua)
	if layout == nil {
		t.Fatal("the script has no LAYOUT table")
	}
	for _, m := range regexp.MustCompile(`(?m)^  ([A-Z][A-Z0-9_]*) = (-?\d+),`).FindAllStringSubmatch(layout[1], -1) {
		v, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			t.Fatalf("LAYOUT.%s = %s: %v", m[1], m[2], err)
		}
		if _, dup := got[m[1]]; dup {
			t.Errorf("the script defines %s twice", m[1])
		}
		got[m[1]] = v
	}
	for name, v := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("the script has no constant %s (Go: %d)", name, v)
		} else if g != v {
			t.Errorf("the script's %s = %d, Go's twin = %d", name, g, v)
		}
	}
	for name, v := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("the script's %s = %d has no Go twin in this test", name, v)
		}
	}
	// The fields each state keeps: FIELDS in engine.lua, algorithm.Fields.
	fields := regexp.MustCompile(`\[(KIND_[A-Z_]+)\] = (\d+),`)
	n := 0
	for _, m := range fields.FindAllStringSubmatch(decideLua, -1) {
		k, v := got[m[1]], m[2]
		if strconv.Itoa(algorithm.Fields[k]) != v {
			t.Errorf("FIELDS[%s] = %s in the script, algorithm.Fields = %d", m[1], v, algorithm.Fields[k])
		}
		n++
	}
	if n != len(algorithm.Fields)-1 {
		t.Errorf("the script's FIELDS names %d algorithms, want %d", n, len(algorithm.Fields)-1)
	}
}

// TestScriptFilesPortTheirTwins: every Lua file is joined into the script
// and says which Go file it ports, and every function its Go twin by name
// and order (checkTwinsByName).
func TestScriptFilesPortTheirTwins(t *testing.T) {
	entries, err := luaFiles.ReadDir("lua")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(scriptFiles) {
		t.Errorf("lua/ holds %d files, the script joins %d", len(entries), len(scriptFiles))
	}
	for _, name := range scriptFiles {
		src, _ := luaFiles.ReadFile("lua/" + name)
		twin := "internal/engine/algorithm/" + strings.TrimSuffix(name, ".lua") + ".go"
		switch name {
		case "codec.lua":
			twin = "redisstore/codec.go"
		case "redisstore.lua":
			twin = "redisstore.Store.Evaluate"
		case "args.lua":
			twin = "redisstore/redisstore.go"
		case "batch.lua":
			twin = "redisstore/batch.go"
		case "short.lua":
			twin = "internal/engine/algorithm/one.go"
		case "carry.lua":
			twin = "internal/engine/algorithm/carry.go"
		case "records.lua":
			twin = "internal/engine/algorithm/engine.go"
		case "dedupe.lua":
			twin = "internal/engine/algorithm/dedupe.go"
		}
		if !strings.Contains(string(src), twin) {
			t.Errorf("%s does not name its Go twin %s", name, twin)
		}
		if name == "short.lua" && !strings.Contains(string(src), "redisstore/short.go") {
			// The short course's two halves name each other (issue 48).
			t.Errorf("short.lua does not name redisstore/short.go, which writes its arguments")
		}
	}
	checkTwinsByName(t)
}

// maxLuaFuncLines bounds a function of the decision code as
// TestFunctionLength bounds a Go function (maxFuncLines, the module's
// surface_test.go): from its first line to its closing end.
const maxLuaFuncLines = 80

// TestLuaFunctionLength keeps every function of the decision code within
// maxLuaFuncLines lines, like every Go function of the module: a function
// is a top-level "local function NAME(" or "NAME = function(" (one
// declared earlier), and ends at the first "end" at the start of a line.
func TestLuaFunctionLength(t *testing.T) {
	start := regexp.MustCompile(`^(?:local function ([A-Za-z_]\w*)\(|([A-Za-z_]\w*) = function\()`)
	for _, name := range scriptFiles {
		src, err := luaFiles.ReadFile("lua/" + name)
		if err != nil {
			t.Fatal(err)
		}
		fn, from := "", 0
		for i, line := range strings.Split(string(src), "\n") {
			if m := start.FindStringSubmatch(line); m != nil {
				if fn != "" {
					t.Errorf("%s:%d: function %s begins before %s (line %d) ends", name, i+1, m[1]+m[2], fn, from)
				}
				fn, from = m[1]+m[2], i+1
			}
			if line == "end" && fn != "" {
				if n := i + 1 - from + 1; n > maxLuaFuncLines {
					t.Errorf("%s:%d: function %s is %d lines, more than %d: split it into functions that each do one thing", name, from, fn, n, maxLuaFuncLines)
				}
				fn = ""
			}
		}
		if fn != "" {
			t.Errorf("%s:%d: function %s has no end at the start of a line", name, from, fn)
		}
	}
}

// TestLuaTopLevelLocals counts the decision code's top-level locals (a
// "local function" is one, "local a, b = …" two): Lua 5.1 refuses a chunk
// of more than 200 (LUAI_MAXVARS), and Redis with it the whole library,
// at load. A new function pays for itself here: fold a helper into its
// caller, or constants into a table, before the count reaches the limit.
func TestLuaTopLevelLocals(t *testing.T) {
	const maxVars = 200 // LUAI_MAXVARS
	fn := regexp.MustCompile(`^local function \w+\(`)
	vars := regexp.MustCompile(`^local ([\w, ]+?)\s*(?:=|$)`)
	n := 0
	for _, line := range strings.Split(decideLua, "\n") {
		if fn.MatchString(line) {
			n++
		} else if m := vars.FindStringSubmatch(line); m != nil {
			n += len(strings.Split(m[1], ","))
		}
	}
	if n > maxVars {
		t.Errorf("the decision code declares %d top-level locals, more than Lua's %d", n, maxVars)
	}
	t.Logf("%d top-level locals of %d", n, maxVars)
}
