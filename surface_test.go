package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxSurface bounds the module's public surface: the exported names of
// its public packages (top-level names, the exported methods of exported
// types, and the methods of exported interfaces; test files left out).
// For scale, counted the same way: golang.org/x/time/rate has 28,
// go-redis/redis_rate 13, sethvargo/go-limiter 19. Counted with interface
// methods the surface was 147 (root 73); sluice.OverrideStore and its two
// methods went (the Limiter declares what it looks for), and the
// middlewares' eight subject builders became subject.KeyFunc and four
// builders shared by both (see docs/MIGRATING.md): 139. The root's cut to
// the contract (docs/MIGRATING.md, "The root cut to the contract"): 129,
// the failure modes' five names moved to package failure included. The Op constants Estimate and Settle and
// Limiter.Meter (issue 33) add three: 132. The Op constant Book and
// Limiter.Wait and Limiter.Reserve (issue 34: waiting on a shared budget,
// x/time/rate's two calls) and sluiceclient's Client.Reserve (the same
// booking over the check API) add four: 136.
const maxSurface = 136

// maxRootSurface bounds the root package's share of it: the contract
// (Policy, Request with its Op, Outcome, Limiter, Store, Clock), not the
// features. Limiter.Release, Limiter.LocalStats, LocalStats, PolicyError,
// ErrUnknownPolicy, ErrCostTooHigh, ErrNotRefundable and
// Policy.WithDefaults went, and FailureMode, the type of the edges' rules
// (httplimit.Route, grpclimit.Method) rather than of a policy, moved to
// package failure with its modes (docs/MIGRATING.md): 55; the Op
// constants Estimate and Settle and Limiter.Meter (issue 33) add three:
// 58, under the round's 60; the Op constant Book and Limiter.Wait and
// Limiter.Reserve (issue 34) add three: 61, one past the round's 60: the
// contract's own operation and the two calls an x/time/rate user looks
// for, their machinery kept in internal/clock (Sleep).
const maxRootSurface = 61

// TestPublicSurface keeps the public surface within maxSurface, so every
// exported name must earn its place. Run with -v for the count per
// package and the names.
func TestPublicSurface(t *testing.T) {
	total := 0
	for _, dir := range publicPackages(t) {
		names := exportedNames(t, dir)
		total += len(names)
		t.Logf("%-13s %3d  %s", dir, len(names), strings.Join(names, " "))
		if dir == "." && len(names) > maxRootSurface {
			t.Errorf("the root package exports %d names, more than %d: the root holds the contract; a feature's names go to its own package or internal/", len(names), maxRootSurface)
		}
	}
	t.Logf("total %d (at most %d)", total, maxSurface)
	if total > maxSurface {
		t.Errorf("the public packages export %d names, more than %d: unexport or move to internal/ what no user needs", total, maxSurface)
	}
}

// publicPackages returns the module's directories holding a public
// package: every directory with Go files outside internal/, cmd/,
// examples/, deploy/, bench/ (a module of its own) and testdata/.
func publicPackages(t *testing.T) []string {
	t.Helper()
	skip := []string{"internal", "cmd", "examples", "deploy", "bench", "testdata"}
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || slices.Contains(skip, d.Name())) {
				return filepath.SkipDir
			}
			return nil
		}
		if dir := filepath.Dir(path); strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// exportedNames returns the exported names of the package in dir, sorted:
// top-level ones, and Type.Method for the exported methods of exported
// types.
func exportedNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == "main" {
			continue
		}
		for _, decl := range f.Decls {
			names = append(names, declNames(decl)...)
		}
	}
	slices.Sort(names)
	return names
}

// declNames returns the exported names decl declares.
func declNames(decl ast.Decl) []string {
	var names []string
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			break
		}
		if d.Recv == nil {
			names = append(names, d.Name.Name)
		} else if recv := receiverType(d.Recv.List[0].Type); ast.IsExported(recv) {
			names = append(names, recv+"."+d.Name.Name)
		}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				if !s.Name.IsExported() {
					break
				}
				names = append(names, s.Name.Name)
				if it, ok := s.Type.(*ast.InterfaceType); ok {
					for _, m := range it.Methods.List {
						for _, n := range m.Names { // none for an embedded interface
							if n.IsExported() {
								names = append(names, s.Name.Name+"."+n.Name)
							}
						}
					}
				}
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	return names
}

// receiverType returns the name of a method's receiver type.
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// maxFuncLines bounds a function of the module outside tests, from its
// func line to its closing brace.
const maxFuncLines = 80

// TestFunctionLength keeps every function of the module's non-test code
// (bench/, a module of its own, aside) within maxFuncLines lines.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bench" || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: func %s is %d lines, more than %d: split it into functions that each do one thing", fset.Position(fn.Pos()), fn.Name.Name, n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
