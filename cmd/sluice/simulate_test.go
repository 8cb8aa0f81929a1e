package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/simulate"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// sim runs sluice simulate with args and returns stdout, the exit code and
// stderr.
func sim(t *testing.T, args ...string) (string, int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := exitCode(run(context.Background(), append([]string{"simulate"}, args...), &out, &errOut), &errOut)
	return out.String(), code, errOut.String()
}

// The promise: the boundary pattern alone shows the fixed window
// admitting about twice its limit and the sliding log not.
func TestSimulateBoundary(t *testing.T) {
	out := filepath.Join(t.TempDir(), "boundary.svg")
	stdout, code, stderr := sim(t, "--pattern", "boundary", "--out", out)
	if code != 0 {
		t.Fatalf("simulate --pattern boundary = exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"fixed_window  10 per 10s       21        20       1                19     1.90",
		"sliding_log  10 per 10s       21        11      10                10     1.00",
		"chart written to " + out,
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("simulate printed\n%s\nwant a line containing %q", stdout, want)
		}
	}
	svg, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(svg, []byte("<svg ")) || !bytes.Contains(svg, []byte("most in one window 19 (1.9× limit)")) {
		t.Errorf("boundary.svg does not chart the fixed window's 19 in one window:\n%.400s", svg)
	}
}

func TestSimulatePoliciesAndCSV(t *testing.T) {
	dir := t.TempDir()
	csv := filepath.Join(dir, "access.csv")
	var b strings.Builder
	b.WriteString("timestamp,path\n")
	for i := range 30 {
		b.WriteString("1714564800." + []string{"1", "2", "3"}[i%3] + ",/login\n")
	}
	if err := os.WriteFile(csv, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	html := filepath.Join(dir, "replay.html")
	stdout, code, stderr := sim(t, "--csv", csv, "--policy", "gcra:5/1s:2", "--policy", "sliding_log:5/1s", "--out", html)
	if code != 0 {
		t.Fatalf("simulate --csv = exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{"gcra:5/1s:2  5 per 1s, burst 2       30         3", "sliding_log:5/1s", "per 1s       30         5"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("simulate --csv printed\n%s\nwant it to contain %q", stdout, want)
		}
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(page, []byte("<!doctype html>")) || !bytes.Contains(page, []byte("<svg ")) || !bytes.Contains(page, []byte("replay of access.csv")) {
		t.Errorf("replay.html is not a page with the chart:\n%.300s", page)
	}
}

func TestSimulateAccuracy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "accuracy")
	stdout, code, stderr := sim(t, "--accuracy", dir)
	if code != 0 {
		t.Fatalf("simulate --accuracy = exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "| boundary | fixed_window | 21 | 20 | 19 (1.9×) |") || !strings.Contains(stdout, "| sliding_worst | fixed_window align=clock | 19 | 19 | 19 (1.9×) |") || strings.Count(stdout, "\n") != 2+30 {
		t.Errorf("simulate --accuracy printed\n%s\nwant a header and 30 rows (5 patterns × 6 policies) with the fixed window's 19 on boundary and the aligned one's 19 on sliding_worst", stdout)
	}
	for _, p := range []string{"poisson", "bursts", "boundary", "sliding_worst", "ramp"} {
		if _, err := os.Stat(filepath.Join(dir, p+".svg")); err != nil {
			t.Errorf("simulate --accuracy wrote no chart for %s: %v", p, err)
		}
	}
}

func TestSimulateUsage(t *testing.T) {
	for _, args := range [][]string{{"help", "simulate"}, {"simulate", "-h"}} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err != nil || !strings.Contains(out.String(), "Usage: sluice simulate") || !strings.Contains(out.String(), "-pattern") {
			t.Errorf("sluice %s = %v, printed %q; want the flags of simulate", strings.Join(args, " "), err, out.String())
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pattern", "zigzag"}, `--pattern "zigzag": must be one of poisson, bursts, boundary, sliding_worst, ramp`},
		{[]string{"--limit", "0"}, "--limit 0: must be between 1 and 1000000000"},
		{[]string{"--window", "0s"}, "--window 0s: must be a positive whole number of microseconds"},
		{[]string{"--policy", "leaky_bucket"}, `--policy "leaky_bucket": algorithm "leaky_bucket": must be one of`},
		{[]string{"--policy", "gcra:ten/1s"}, `--policy "gcra:ten/1s": limit "ten": want a whole number`},
		{[]string{"--policy", "fixed_window:5/1s:3"}, `--policy "fixed_window:5/1s:3": burst "3": applies only to token_bucket and gcra`},
		{[]string{"--pattern", "poisson", "--rate", "1e9"}, "--rate 1e+09: rate × duration is"},
		{[]string{"--duration", "1s"}, "--duration 1s: must be between one window and 1000 windows"},
		{[]string{"--out", "chart.png"}, `--out "chart.png": must end in .svg or .html`},
		{[]string{"--accuracy", "x", "--pattern", "ramp"}, "--accuracy runs the built-in patterns at their defaults"},
		{[]string{"--csv", "a.csv", "--pattern", "ramp"}, "--csv replays a file: leave out --pattern"},
		{[]string{"--pattern", "boundary", "--rate", "5"}, "--rate does not apply to boundary: only to poisson, bursts, ramp"},
		{[]string{"--pattern", "ramp", "--on", "1s"}, "--on does not apply to ramp: only to bursts"},
		{[]string{"--csv", "a.csv", "--duration", "1m"}, "--duration does not apply to a --csv replay: only to poisson,"},
		{[]string{"--off", "-1s", "--pattern", "bursts"}, "--off -1s: must not be negative"},
	} {
		stdout, code, stderr := sim(t, c.args...)
		if code != 2 || !strings.Contains(stderr, "sluice: simulate: "+c.want) {
			t.Errorf("simulate %v = exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
		if stdout != "" {
			t.Errorf("simulate %v printed %q on stdout, want nothing", c.args, stdout)
		}
	}
	_, code, stderr := sim(t, "--csv", filepath.Join(t.TempDir(), "missing.csv"))
	if code != 1 || !strings.Contains(stderr, "--csv") || !strings.Contains(stderr, "no such file") {
		t.Errorf("simulate --csv missing.csv = exit %d, stderr %q; want 1 naming the file", code, stderr)
	}
}

// ACCURACY.md's post-hoc table is what simulate --pattern post_hoc prints.
func TestAccuracyDocPostHoc(t *testing.T) {
	stdout, code, stderr := sim(t, "--pattern", "post_hoc", "--limit", "100", "--window", "10s")
	if code != 0 {
		t.Fatalf("simulate --pattern post_hoc = exit %d\n%s", code, stderr)
	}
	doc, err := os.ReadFile("../../ACCURACY.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), stdout) {
		t.Errorf("ACCURACY.md does not hold the table simulate --pattern post_hoc prints:\n%s\nregenerate with: go run ./cmd/sluice simulate --pattern post_hoc --limit 100 --window 10s, and paste its table into ACCURACY.md", stdout)
	}
}

// ACCURACY.md and its charts are what the engine does today: regenerate
// them with the command this names when the math or the charts change.
func TestAccuracyDocIsCurrent(t *testing.T) {
	dir := t.TempDir()
	stdout, code, stderr := sim(t, "--accuracy", dir)
	if code != 0 {
		t.Fatalf("simulate --accuracy = exit %d\n%s", code, stderr)
	}
	const regenerate = "regenerate with: go run ./cmd/sluice simulate --accuracy docs/accuracy, and paste its table into ACCURACY.md"
	doc, err := os.ReadFile("../../ACCURACY.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), stdout) {
		t.Errorf("ACCURACY.md does not hold the table simulate --accuracy prints:\n%s\n%s", stdout, regenerate)
	}
	for _, p := range []string{"poisson", "bursts", "boundary", "sliding_worst", "ramp"} {
		got, err := os.ReadFile(filepath.Join(dir, p+".svg"))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join("../../docs/accuracy", p+".svg"))
		if err != nil || !bytes.Equal(got, committed) {
			t.Errorf("docs/accuracy/%s.svg differs from what simulate draws now (%v): %s", p, err, regenerate)
		}
	}
}

// TestSimulateLocalQuotaCLI runs sluice simulate --local-quota at a
// smaller limit than the doc's, and refuses flags that do not apply.
func TestSimulateLocalQuotaCLI(t *testing.T) {
	redistest.Long(t)
	stdout, code, stderr := sim(t, "--local-quota", "--limit", "1000", "--instances", "2", "--seed", "3")
	if code != 0 {
		t.Fatalf("simulate --local-quota = exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.HasPrefix(stdout, "| pattern | algorithm | offered | admitted: local ÷ exact |") || strings.Count(stdout, "\n") != 2+6*len(simulate.LocalQuotaPatterns) ||
		!strings.Contains(stdout, "| step | gcra burst=20 | ") || !strings.Contains(stdout, "| poisson | fixed_window align=clock | ") {
		t.Errorf("simulate --local-quota --limit 1000 printed\n%s\nwant the header and 36 rows, gcra burst=20 among them", stdout)
	}
	if strings.Contains(stdout, "**no**") {
		t.Errorf("simulate --local-quota --limit 1000 printed a row over its bound:\n%s", stdout)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--local-quota", "--pattern", "ramp"}, "--local-quota runs the built-in patterns at their defaults"},
		{[]string{"--local-quota", "--accuracy", "x"}, "--local-quota runs the built-in patterns at their defaults: leave out --accuracy"},
		{[]string{"--instances", "3"}, "--instances applies only to --local-quota"},
		{[]string{"--local-quota", "--instances", "0"}, "--instances 0: must be between 1 and 64"},
		{[]string{"--local-quota", "--limit", "100"}, "--limit 100: must be at least 400 with --local-quota"},
		{[]string{"--local-quota", "--window", "1ms"}, `--local-quota: policy "fixed_window": local_quota = true: needs blocks of at least 1ms, and this policy allows them at most 500µs`},
	} {
		stdout, code, stderr := sim(t, c.args...)
		if code != 2 || !strings.Contains(stderr, "sluice: simulate: "+c.want) {
			t.Errorf("simulate %v = exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
		if stdout != "" {
			t.Errorf("simulate %v printed %q on stdout, want nothing", c.args, stdout)
		}
	}
}
