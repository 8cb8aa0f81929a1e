package wiring_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// module is the import path of the module scanned.
const module = "github.com/sluicehq/sluice"

// constructors are the calls that make a Limiter or a store, by the
// import path of their package.
var constructors = map[string]string{
	module:                 "New", // sluice.New
	module + "/memstore":   "New",
	module + "/redisstore": "New",
}

// mayConstruct are the folders (relative to the module root) whose
// non-test files may call a constructor, and why; every other package's
// Limiters and stores come from this package.
var mayConstruct = map[string]string{
	".":                 "the root package itself",
	"memstore":          "the store itself",
	"redisstore":        "the store itself",
	"sluicetest":        "the exported store suite builds Limiters on the store under test",
	"httplimit":         "a public edge: PerIP builds its own Limiter for a caller without a config",
	"grpclimit":         "a public edge",
	"internal/edge":     "the edge core's local fallback Limiter, on the store it is handed",
	"internal/wiring":   "the one place",
	"internal/bench":    "sluice bench: a Limiter of the bench's own policies over the store internal/wiring builds",
	"internal/simulate": "the local-quota simulator: a memstore and Limiters per simulated instance, on a virtual clock",
}

// mayConstructFile are single files allowed outside mayConstruct, and why.
var mayConstructFile = map[string]string{
	"internal/envoy/rls/override.go": "a Limiter per limit override an Envoy request carries, made at request time on the state's store: a request's, not a config's",
}

// TestOnePlaceBuildsLimitersAndStores fails when a package other than
// internal/wiring (and those mayConstruct names) calls sluice.New,
// memstore.New or redisstore.New in a non-test file: a command or the
// server building a Limiter or a store of a config itself. Tests,
// examples and the bench module (its own module) are not scanned.
func TestOnePlaceBuildsLimitersAndStores(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	scanned := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || rel == "examples" || isModule(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		if _, ok := mayConstruct[filepath.ToSlash(filepath.Dir(rel))]; ok {
			return nil
		}
		if _, ok := mayConstructFile[rel]; ok {
			return nil
		}
		scanned++
		for _, call := range constructorCalls(t, path) {
			t.Errorf("%s:%d calls %s: build a config's Limiters and stores in internal/wiring (Build, NewStore), not here", rel, call.line, call.name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 20 {
		t.Fatalf("scanned %d files, want the module's (internal/server, cmd/sluice among them)", scanned)
	}
}

// isModule reports whether dir holds a module of its own (the bench
// module).
func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

type call struct {
	name string
	line int
}

// constructorCalls returns the constructor calls of the file at path,
// resolving each package by its import path, whatever name it is
// imported under.
func constructorCalls(t *testing.T, path string) []call {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	names := map[string]string{} // local name → import path
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if _, ok := constructors[p]; !ok {
			continue
		}
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = p
	}
	var calls []call
	ast.Inspect(f, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		x, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		if p, ok := names[x.Name]; ok && constructors[p] == sel.Sel.Name {
			calls = append(calls, call{name: x.Name + "." + sel.Sel.Name, line: fset.Position(c.Pos()).Line})
		}
		return true
	})
	return calls
}
