package server_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path"
	"strings"
	"testing"
)

// module is the import path of the module whose layers are checked.
const module = "github.com/sluicehq/sluice"

// layers is DESIGN.md's layer map, top row first, drawn from what go list
// shows: a package may import only packages of rows below its own. Each
// package of the module has a row, so a new one must be placed here.
// Paths are relative to the module ("" is the root package, sluice).
// The folders say who owns them (TestNesting): internal/server/... is the
// server and what only it uses, internal/envoy/... the Envoy side,
// internal/engine/... the decision engine below the root,
// internal/testkit/... the harnesses of real processes for tests, and the
// other internal/ packages helpers. Where this order differs from
// DESIGN.md's table, the imports decided: the stores, sluicetest,
// internal/evaluation and internal/ratelimitheader import the root,
// so they sit above it; internal/bench builds its stores through
// internal/wiring, so it sits above it; internal/simulate runs the local
// quota simulator on memstore, so it sits above the stores.
var layers = []struct {
	name     string
	packages []string
}{
	{"commands", []string{"cmd/sluice", "deploy", "examples/demo", "examples/llmtokens"}},
	{"server", []string{"internal/server"}},
	{"bench", []string{"internal/bench"}},
	{"wiring", []string{"internal/wiring"}},
	{"envoy rate-limit services", []string{"internal/envoy/rls", "internal/envoy/rlqs"}},
	{"envoy rules files", []string{"internal/envoy/rules"}},
	{"envoy quota ledger", []string{"internal/envoy/rlqs/ledger"}},
	{"edges", []string{"httplimit", "grpclimit", "sluiceclient"}},
	{"edge core", []string{"internal/edge"}},
	{"check API wire", []string{"internal/checkapi"}},
	{"check API messages", []string{"internal/checkpb"}},
	{"config", []string{"internal/config"}},
	{"subjects", []string{"subject"}},
	{"simulation", []string{"internal/simulate"}},
	{"stores", []string{"memstore", "redisstore"}},
	{"store suite", []string{"sluicetest"}},
	{"test draws", []string{"internal/testkit/draw"}},
	{"header fields", []string{"internal/ratelimitheader"}},
	{"evaluation", []string{"internal/evaluation"}},
	{"contract", []string{""}},
	{"stages", []string{"internal/localquota", "internal/overridemap"}},
	{"the decision's form (short or general)", []string{"internal/form"}},
	{"policy defaults", []string{"internal/policydefaults"}},
	{"engine", []string{"internal/engine/algorithm"}},
	{"failure modes", []string{"failure"}},
	{"helpers", []string{"internal/yamlnode", "internal/sfparse", "internal/logthrottle", "internal/testkit/redistest", "internal/testkit/faultproxy", "internal/testkit/servetest", "internal/testkit/openapitest", "internal/testkit/envoyrlqs", "internal/clock", "internal/policyerr", "internal/period", "internal/redisreply"}},
}

// groupFolders are folders that group packages rather than belong to one:
// a package under them is owned by no package above it in the folder.
var groupFolders = map[string]bool{"internal": true, "internal/engine": true, "internal/envoy": true, "internal/testkit": true, "examples": true, "cmd": true}

// TestNesting holds the folders true: a package nested under another
// package's folder (internal/server/h1 under internal/server) is that
// package's own, imported only by packages inside the folder. Folders
// that only group packages (internal, internal/envoy, ...) own nothing.
// Tests may import across (a test may read whatever it checks).
func TestNesting(t *testing.T) {
	pkgs := listModule(t)
	isPkg := map[string]bool{}
	for _, p := range pkgs {
		isPkg[strings.TrimPrefix(p.ImportPath, module+"/")] = true
	}
	owner := func(rel string) string { // the nearest package folder above rel, or ""
		for dir := path.Dir(rel); dir != "." && dir != "/"; dir = path.Dir(dir) {
			if isPkg[dir] && !groupFolders[dir] {
				return dir
			}
		}
		return ""
	}
	for _, p := range pkgs {
		from := strings.TrimPrefix(p.ImportPath, module+"/")
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(imp, module+"/")
			if own := owner(to); own != "" && from != own && !strings.HasPrefix(from, own+"/") {
				t.Errorf("%s imports %s, which is nested under %s's folder: only %s and the packages inside its folder may import it; move it beside the packages that use it", p.ImportPath, imp, own, own)
			}
		}
	}
}

// listedPackage is what TestLayers reads of go list -json.
type listedPackage struct {
	ImportPath string
	Imports    []string // of the package's own files, not its tests'
}

// TestLayers holds the layer map true for every package of the module:
// an import only points to a row below the importer's. Tests may import
// upwards (the root's examples use memstore); their imports are not
// checked.
func TestLayers(t *testing.T) {
	row := map[string]int{}
	for i, l := range layers {
		for _, p := range l.packages {
			row[strings.TrimSuffix(module+"/"+p, "/")] = i
		}
	}
	pkgs := listModule(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s, want the whole module", len(pkgs), module)
	}
	for _, p := range pkgs {
		from, ok := row[p.ImportPath]
		if !ok {
			t.Errorf("%s is in no row of the layer map: place it in layers (and DESIGN.md's table)", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if to, ok := row[imp]; ok && to <= from {
				t.Errorf("%s (row %q) imports %s (row %q): an import may only point to a row below", p.ImportPath, layers[from].name, imp, layers[to].name)
			}
		}
	}
}

// listModule returns every package of the module, as go list sees it.
func listModule(t *testing.T) []listedPackage {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the module's packages: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-json=ImportPath,Imports", "./...")
	cmd.Dir = "../.." // the module root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
}
