package sluice_test

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// snippet is one ```go block of README.md or of a page under docs/.
type snippet struct {
	file  string // README.md, docs/redis.md, …
	line  int    // of its opening fence
	code  string // between the fences
	given string // the Go declarations of the comment before it, or ""
}

// givenComment starts the HTML comment (invisible on a rendered page)
// that declares, as Go source after its package clause, what a fragment
// uses but does not define, e.g. a limiter built in an earlier snippet:
//
//	<!-- given (Go, for the README test):
//	import "github.com/sluicehq/sluice"
//
//	var limiter *sluice.Limiter
//	-->
const givenComment = "<!-- given (Go, for the README test):"

// TestREADMESnippetsCompile builds every ```go block of README.md and of
// the pages under docs/ (docFiles) as a user would paste it, with its import lines: a block that starts with a
// package clause as the file it is; any other as a fragment, its import
// block on top and the rest the body of a function, beside the
// declarations of the given comment just before it (a file of its own).
// Every variable a fragment defines is used, so that declaring one the
// snippet leaves for the reader to use is not an error. The packages are
// type-checked with go vet inside the module, so they import this
// module's packages as they are.
func TestREADMESnippetsCompile(t *testing.T) {
	var snippets []snippet
	for _, file := range docFiles(t) {
		got := readmeSnippets(t, file)
		if file == "README.md" && len(got) < 4 {
			t.Fatalf("README.md has %d ```go blocks, want one per Go entry point (library, httplimit, grpclimit, sluiceclient)", len(got))
		}
		snippets = append(snippets, got...)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the snippets: %v", err)
	}
	// Inside the module, so the snippets import its packages; "_" keeps
	// ./... patterns of anyone else from seeing it.
	dir, err := os.MkdirTemp(".", "_readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	args := []string{"vet"}
	for _, s := range snippets {
		pkg := filepath.Join(dir, s.pkg())
		if err := os.Mkdir(pkg, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(pkg, "snippet.go"), s.source())
		if s.given != "" {
			write(t, filepath.Join(pkg, "given.go"), "package main\n\n"+s.given)
		}
		args = append(args, "./"+filepath.ToSlash(pkg))
	}
	out, err := exec.Command(goTool, args...).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("go vet: %v", err)
	}
	if err == nil {
		return
	}
	blamed := false
	for _, s := range snippets {
		tag := "/" + s.pkg() + "/"
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, tag) && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			blamed = true
			t.Errorf("%s:%d: the go snippet does not compile (as %s):\n%s\nsource:\n%s", s.file, s.line, dir, strings.Join(lines, "\n"), s.source())
		}
	}
	if !blamed {
		t.Errorf("go vet of the README snippets: %v\n%s", err, out)
	}
}

// docFiles are the Markdown files whose snippets the tests check:
// README.md and every page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, pages...)
}

// pkg is the directory s builds in: its file and line, e.g.
// docs_redis_line12.
func (s snippet) pkg() string {
	name := strings.TrimSuffix(filepath.ToSlash(s.file), ".md")
	name = strings.NewReplacer("/", "_", "-", "_", ".", "_").Replace(name)
	return fmt.Sprintf("%s_line%d", name, s.line)
}

// readmeSnippets returns the ```go blocks of the Markdown file path.
func readmeSnippets(t *testing.T, path string) []snippet {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out     []snippet
		cur     *snippet
		given   []string // the given comment being read, or the last one
		inGiven bool
		n       int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		case inGiven && strings.TrimSpace(line) == "-->":
			inGiven = false
		case inGiven:
			given = append(given, line)
		case strings.HasPrefix(line, givenComment):
			inGiven, given = true, nil
		case line == "```go":
			cur = &snippet{file: path, line: n, given: strings.Join(given, "\n")}
			given = nil
		case strings.TrimSpace(line) != "":
			given = nil // a given comment applies to the block right after it
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ```go block is not closed", path, cur.line)
	}
	return out
}

// source is the file s builds as: itself when it has a package clause,
// else the fragment wrapped in package main.
func (s snippet) source() string {
	if strings.HasPrefix(strings.TrimSpace(s.code), "package ") {
		return s.code
	}
	imports, body := splitImports(s.code)
	return "package main\n\n" + imports + "\nfunc main() {}\n\nfunc snippet() {\n" + body + used(body) + "}\n"
}

// splitImports splits a fragment into its leading import declarations
// and the rest.
func splitImports(code string) (imports, body string) {
	lines := strings.SplitAfter(code, "\n")
	i, inBlock := 0, false
	for ; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case inBlock:
			inBlock = l != ")"
		case strings.HasPrefix(l, "import ("):
			inBlock = true
		case strings.HasPrefix(l, "import "), l == "":
		default:
			return strings.Join(lines[:i], ""), strings.Join(lines[i:], "")
		}
	}
	return code, ""
}

// used returns a statement using each variable body defines at its top
// level, e.g. "_ = store\n"; "" when body does not parse (the build then
// reports why).
func used(body string) string {
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc f() {\n"+body+"\n}", parser.SkipObjectResolution)
	if err != nil {
		return ""
	}
	var b strings.Builder
	seen := map[string]bool{"_": true}
	for _, stmt := range f.Decls[0].(*ast.FuncDecl).Body.List {
		if as, ok := stmt.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
			for _, lhs := range as.Lhs {
				if id, ok := lhs.(*ast.Ident); ok && !seen[id.Name] {
					seen[id.Name] = true
					fmt.Fprintf(&b, "_ = %s\n", id.Name)
				}
			}
		}
	}
	return b.String()
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestREADMEIsTheFrontDoor holds the README to what it is for: at most 500
// lines, a link to every page under docs/, and no relative link, from it,
// a docs page, the other top-level pages or the benchmark history under
// bench/results/, to a file that does not exist.
func TestREADMEIsTheFrontDoor(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 500 {
		t.Errorf("README.md has %d lines, want at most 500: reference material belongs in a page under docs/", n)
	}
	files := docFiles(t)
	for _, page := range files[1:] {
		if !strings.Contains(string(readme), "]("+filepath.ToSlash(page)+")") {
			t.Errorf("README.md does not link to %s", page)
		}
	}
	others, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	others = slices.DeleteFunc(others, func(f string) bool { return f == "README.md" })
	history, err := filepath.Glob(filepath.Join("bench", "results", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range append(append(files, others...), history...) {
		checkLinks(t, file)
	}
}

// link is a Markdown link's target: a relative path, an #anchor, or both.
var link = regexp.MustCompile(`\]\(([^)#:\s]*)(?:#([^)\s]*))?\)`)

// checkLinks fails for each relative link of file to a file that does not
// exist, or to a heading a Markdown file does not have.
func checkLinks(t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range link.FindAllStringSubmatch(string(data), -1) {
		target := file
		if m[1] != "" {
			target = filepath.ToSlash(filepath.Join(filepath.Dir(file), m[1]))
		}
		body, err := os.ReadFile(target)
		if err != nil {
			if _, statErr := os.Stat(target); statErr != nil {
				t.Errorf("%s links to %s, which does not exist", file, m[1])
			}
			continue // a directory
		}
		if m[2] != "" && strings.HasSuffix(target, ".md") && !anchors(string(body))[m[2]] {
			t.Errorf("%s links to %s#%s, which has no such heading", file, target, m[2])
		}
	}
}

// anchors are the ids GitHub gives the headings of a Markdown page: the
// heading's text lower-cased, spaces as hyphens, punctuation dropped, a
// repeated one suffixed -1, -2, ….
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		text, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if fence || !strings.HasPrefix(line, "#") || !ok {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			out[fmt.Sprintf("%s-%d", id, n)] = true
		} else {
			out[id] = true
		}
		seen[id]++
	}
	return out
}

// TestDocNamesEveryEntryPoint holds the package documentation (go doc
// github.com/sluicehq/sluice) to naming every public package of the module
// and the sluice command, so a reader of go doc finds httplimit, grpclimit
// and the server from the root.
func TestDocNamesEveryEntryPoint(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	out, err := exec.Command("go", "list", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(pkg, "github.com/sluicehq/sluice")
		if rel == "" || strings.Contains(rel, "/internal/") || strings.HasPrefix(rel, "/examples/") || rel == "/deploy" {
			continue
		}
		if !strings.Contains(doc, pkg) {
			t.Errorf("doc.go's package documentation does not name %s", pkg)
		}
	}
}
