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
// its public packages (top-level names, plus the exported methods of
// exported types; test files left out). For scale, counted the same way:
// golang.org/x/time/rate has 28, go-redis/redis_rate 13,
// sethvargo/go-limiter 19. 131 is the 120 of before grpclimit plus the 11
// names grpclimit adds (New, Options, Method, Interceptors and its Unary,
// Stream and Limit, SubjectFunc, ClientIP, Metadata, Principal). 138
// adds the 8 names of runtime overrides: sluice.Override,
// sluice.OverrideStore, Limiter.SetOverride and Limiter.Overrides, and
// the PutOverride and Overrides of memstore and redisstore. 141 adds
// local quota's sluice.LocalQuota, sluice.LocalStats and
// Limiter.LocalStats.
const maxSurface = 141

// TestPublicSurface keeps the public surface within maxSurface, so every
// exported name must earn its place. Run with -v for the count per
// package and the names.
func TestPublicSurface(t *testing.T) {
	total := 0
	for _, dir := range publicPackages(t) {
		names := exportedNames(t, dir)
		total += len(names)
		t.Logf("%-13s %3d  %s", dir, len(names), strings.Join(names, " "))
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
				if s.Name.IsExported() {
					names = append(names, s.Name.Name)
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
