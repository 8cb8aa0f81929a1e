package simulate

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// run generates pattern for limit per window and runs the five algorithms
// on it.
func run(t *testing.T, pattern string, limit, window int64) *Result {
	t.Helper()
	arrivals, start, end, err := Generate(PatternSpec{Name: pattern}, limit, window)
	if err != nil {
		t.Fatalf("Generate(%s, %d, %d): %v", pattern, limit, window, err)
	}
	res, err := Run(Spec{Start: start, End: end, Arrivals: arrivals, Policies: Compare(limit, window, 0)})
	if err != nil {
		t.Fatalf("Run(%s): %v", pattern, err)
	}
	return res
}

func byName(t *testing.T, res *Result, name string) *PolicyResult {
	t.Helper()
	for i := range res.Results {
		if res.Results[i].Policy.Name == name {
			return &res.Results[i]
		}
	}
	t.Fatalf("no result for %s", name)
	return nil
}

// The numbers the tests run at: the default 10 per 10s, a limit that does
// not divide the window evenly, and a large limit.
var numbersCases = []struct{ limit, window int64 }{
	{10, 10_000_000},
	{3, 1_000_000},
	{7, 60_000_000},
	{100, 1_000_000},
}

func TestBoundaryFixedWindowAdmitsTwiceItsLimit(t *testing.T) {
	for _, c := range numbersCases {
		res := run(t, Boundary, c.limit, c.window)
		// One unit opens the window; limit − 1 more before the edge and
		// the full limit after it all fall in one window-long interval.
		if got, want := byName(t, res, "fixed_window").MaxInWindow, int(2*c.limit-1); got != want {
			t.Errorf("%d per %dµs: fixed_window MaxInWindow = %d, want 2×limit−1 = %d", c.limit, c.window, got, want)
		}
		if got := byName(t, res, "sliding_log").MaxInWindow; got > int(c.limit) {
			t.Errorf("%d per %dµs: sliding_log MaxInWindow = %d, want at most the limit %d", c.limit, c.window, got, c.limit)
		}
	}
}

func TestSlidingWorstOverAdmitsTheCounter(t *testing.T) {
	for _, c := range numbersCases {
		res := run(t, SlidingWorst, c.limit, c.window)
		if got, want := byName(t, res, "sliding_window").MaxInWindow, int(2*c.limit-1); got != want {
			t.Errorf("%d per %dµs: sliding_window MaxInWindow = %d, want 2×limit−1 = %d", c.limit, c.window, got, want)
		}
		if got := byName(t, res, "fixed_window").MaxInWindow; got > int(c.limit) {
			t.Errorf("%d per %dµs: fixed_window MaxInWindow = %d, want at most %d", c.limit, c.window, got, c.limit)
		}
	}
}

// The sliding log is the definition: it never exceeds the limit and agrees
// with the exact reference on every request of every pattern.
func TestSlidingLogIsExact(t *testing.T) {
	for _, c := range numbersCases {
		for _, pattern := range Patterns {
			pr := byName(t, run(t, pattern, c.limit, c.window), "sliding_log")
			if pr.MaxInWindow > int(c.limit) || pr.FalseAdmits != 0 || pr.FalseDenials != 0 {
				t.Errorf("%s, %d per %dµs: sliding_log max %d, false admissions %d, false denials %d; want ≤ %d, 0, 0",
					pattern, c.limit, c.window, pr.MaxInWindow, pr.FalseAdmits, pr.FalseDenials, c.limit)
			}
		}
	}
}

// Token bucket and GCRA admit the same requests for the same numbers.
func TestBucketsAgree(t *testing.T) {
	for _, pattern := range Patterns {
		res := run(t, pattern, 10, 10_000_000)
		tb, g := byName(t, res, "token_bucket"), byName(t, res, "gcra")
		if !slices.Equal(tb.Admitted, g.Admitted) {
			t.Errorf("%s: token_bucket and gcra admitted different requests", pattern)
		}
	}
}

func TestCountsAddUp(t *testing.T) {
	for _, pattern := range Patterns {
		res := run(t, pattern, 10, 10_000_000)
		for _, pr := range res.Results {
			n := 0
			for _, a := range pr.Admitted {
				if a {
					n++
				}
			}
			if pr.Allowed != n || pr.Allowed+pr.Denied != pr.Offered || pr.Offered != len(res.Spec.Arrivals) {
				t.Errorf("%s %s: allowed %d (verdicts say %d) + denied %d != offered %d (arrivals %d)", pattern, pr.Policy.Name, pr.Allowed, n, pr.Denied, pr.Offered, len(res.Spec.Arrivals))
			}
			counts := pr.TrailingCounts(res.Spec.Arrivals)
			if m := slices.Max(append(counts, 0)); m != pr.MaxInWindow {
				t.Errorf("%s %s: TrailingCounts peak %d, MaxInWindow %d", pattern, pr.Policy.Name, m, pr.MaxInWindow)
			}
		}
	}
}

func TestPoissonIsSeeded(t *testing.T) {
	gen := func(seed uint64) []int64 {
		a, _, _, err := Generate(PatternSpec{Name: Poisson, Seed: seed}, 10, 10_000_000)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a, b := gen(7), gen(7); !slices.Equal(a, b) {
		t.Errorf("seed 7 twice gave different arrivals")
	}
	if a, b := gen(7), gen(8); slices.Equal(a, b) {
		t.Errorf("seeds 7 and 8 gave the same arrivals")
	}
	// The mean rate is 2 per second over 300s: about 600 requests.
	if n := len(gen(1)); n < 500 || n > 700 {
		t.Errorf("poisson at 2/s over 300s gave %d requests, want about 600", n)
	}
}

// Step is a lull at half the limit's rate for a window, then a flood at
// four times it for half a window, repeated, the same for the same seed.
func TestStepLullThenFlood(t *testing.T) {
	const limit, window = 1000, 10_000_000
	gen := func(seed uint64) []int64 {
		a, _, end, err := Generate(PatternSpec{Name: Step, Seed: seed}, limit, window)
		if err != nil {
			t.Fatal(err)
		}
		if start := Epoch(window); end != start+6*window {
			t.Fatalf("step spans %d µs, want 6 windows", end-start)
		}
		return a
	}
	a := gen(1)
	if b, c := gen(1), gen(2); !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Errorf("seed 1 twice gave different arrivals, or seeds 1 and 2 the same")
	}
	// Six windows, twelve half windows: lull, lull, flood, lull, lull,
	// flood, …, four of each phase. A lull offers about limit/2, a flood
	// about 4 × limit × ½.
	phaseOf := []int{0, 0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7}
	counts := make([]int, 8)
	for _, at := range a {
		counts[phaseOf[(at-Epoch(window))*2/window]]++
	}
	for i, got := range counts {
		want := limit / 2
		if i%2 == 1 {
			want = 2 * limit
		}
		if got < want*8/10 || got > want*12/10 {
			t.Errorf("phase %d offered %d requests, want about %d (all phases: %v)", i, got, want, counts)
		}
	}
}

func TestBadInput(t *testing.T) {
	good := Compare(10, 10_000_000, 0)
	start := Epoch(10_000_000)
	for _, c := range []struct {
		name  string
		spec  Spec
		field string
	}{
		{"no policies", Spec{Start: start, End: start + 1}, "policies"},
		{"end before start", Spec{Start: start, End: start, Policies: good}, "end"},
		{"limit 0", Spec{Start: start, End: start + 1, Policies: []Policy{{Name: "x", Kind: algorithm.KindGCRA, Params: algorithm.Params{Window: 1000, Burst: 1}}}}, "policies[0].limit"},
		{"unsorted", Spec{Start: start, End: start + 10, Arrivals: []int64{start + 2, start + 1}, Policies: good}, "arrivals[1]"},
		{"outside", Spec{Start: start, End: start + 10, Arrivals: []int64{start + 10}, Policies: good}, "arrivals[0]"},
	} {
		_, err := Run(c.spec)
		var se *Error
		if !errors.As(err, &se) || se.Field != c.field {
			t.Errorf("%s: Run = %v, want an *Error for %s", c.name, err, c.field)
		}
	}
	for _, c := range []struct {
		ps    PatternSpec
		field string
	}{
		{PatternSpec{Name: "zigzag"}, "pattern"},
		{PatternSpec{Name: Poisson, Duration: 1}, "duration"},
		{PatternSpec{Name: Poisson, Duration: 2000 * 10_000_000}, "duration"},
		{PatternSpec{Name: Poisson, Rate: 1e9}, "rate"},
		{PatternSpec{Name: Ramp, Rate: -1}, "rate"},
	} {
		_, _, _, err := Generate(c.ps, 10, 10_000_000)
		var se *Error
		if !errors.As(err, &se) || se.Field != c.field {
			t.Errorf("Generate(%+v) = %v, want an *Error for %s", c.ps, err, c.field)
		}
	}
}

func TestReadCSV(t *testing.T) {
	in := "time,path\n2024-05-01T12:00:00.25Z,/a\n# comment\n\n1714564800.5,/b\n1714564801\n"
	arrivals, start, end, err := ReadCSV(strings.NewReader(in), 10_000_000)
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{1714564800_250000, 1714564800_500000, 1714564801_000000}
	if !slices.Equal(arrivals, want) {
		t.Errorf("ReadCSV arrivals = %v, want %v", arrivals, want)
	}
	if start != 1714564800_000000 || end != 1714564810_000000 {
		t.Errorf("ReadCSV start, end = %d, %d; want 1714564800000000, 1714564810000000", start, end)
	}
	_, _, _, err = ReadCSV(strings.NewReader("1714564800\nyesterday\n"), 10_000_000)
	if err == nil || !strings.Contains(err.Error(), "csv line 2") || !strings.Contains(err.Error(), `"yesterday"`) {
		t.Errorf("ReadCSV with a bad line 2 = %v, want an error naming line 2 and the value", err)
	}
	if _, _, _, err = ReadCSV(strings.NewReader("time\n"), 10_000_000); err == nil {
		t.Errorf("ReadCSV of a header alone = nil error, want one")
	}
}

func TestSVGIsSelfContained(t *testing.T) {
	res := run(t, Boundary, 10, 10_000_000)
	var b bytes.Buffer
	if err := SVG(&b, res, `boundary <&> "test"`); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	lanes := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "g" {
			lanes++
		}
	}
	if lanes != 5 {
		t.Errorf("SVG has %d lanes, want 5", lanes)
	}
	if n := strings.Count(b.String(), "http"); n != 1 { // the xmlns only
		t.Errorf("SVG mentions http %d times, want only its xmlns: no external assets", n)
	}
}
