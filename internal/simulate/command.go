package simulate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// What sluice simulate runs besides the simulation itself: its --policy
// spelling, its errors in the flags' names, its charts on disk and
// ACCURACY.md's run, so that cmd/sluice keeps only flags and output.

// ParsePolicies returns the policies of sluice simulate's --policy
// specs, or with none all five algorithms at limit per window (µs), with
// a bucket of burst (the limit when 0). An error names the flag.
func ParsePolicies(specs []string, limit, window, burst int64) ([]Policy, error) {
	if len(specs) == 0 {
		ps := Compare(limit, window, burst)
		for _, p := range ps {
			if err := p.Params.Check(p.Kind); err != nil {
				return nil, FlagError(err)
			}
		}
		return ps, nil
	}
	var out []Policy
	for _, spec := range specs {
		p, err := parsePolicy(spec, limit, window, burst)
		if err != nil {
			return nil, fmt.Errorf("--policy %q: %w", spec, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePolicy reads ALG[:LIMIT/WINDOW[:BURST]], one --policy, the
// numbers it leaves out taken from limit, window (µs) and burst.
func parsePolicy(spec string, limit, window, burst int64) (Policy, error) {
	parts := strings.Split(spec, ":")
	if len(parts) > 3 {
		return Policy{}, errors.New("want ALG[:LIMIT/WINDOW[:BURST]], e.g. token_bucket:100/1m:20")
	}
	kind, err := ParseKind(parts[0])
	if err != nil {
		return Policy{}, err
	}
	name := parts[0]
	if len(parts) >= 2 {
		l, w, ok := strings.Cut(parts[1], "/")
		if !ok {
			return Policy{}, fmt.Errorf("numbers %q: want LIMIT/WINDOW, e.g. 100/1m", parts[1])
		}
		if limit, err = strconv.ParseInt(l, 10, 64); err != nil {
			return Policy{}, fmt.Errorf("limit %q: want a whole number", l)
		}
		d, err := time.ParseDuration(w)
		if err != nil || d <= 0 || d%time.Microsecond != 0 {
			return Policy{}, fmt.Errorf("window %q: want a positive duration of whole microseconds, e.g. 10s or 1m", w)
		}
		window = d.Microseconds()
		name += ":" + parts[1]
		burst = 0
	}
	if len(parts) == 3 {
		if kind != algorithm.KindTokenBucket && kind != algorithm.KindGCRA {
			return Policy{}, fmt.Errorf("burst %q: applies only to token_bucket and gcra", parts[2])
		}
		if burst, err = strconv.ParseInt(parts[2], 10, 64); err != nil {
			return Policy{}, fmt.Errorf("burst %q: want a whole number", parts[2])
		}
		name += ":" + parts[2]
	}
	if burst == 0 || kind != algorithm.KindTokenBucket && kind != algorithm.KindGCRA {
		burst = limit
	}
	p := Policy{Name: name, Kind: kind, Params: algorithm.Params{Limit: limit, Window: window, Burst: burst}}
	if err := p.Params.Check(kind); err != nil {
		return Policy{}, FlagError(err)
	}
	return p, nil
}

// patternFlags are the flags of sluice simulate that shape some patterns
// only, each with the patterns it shapes, in the order they are checked.
var patternFlags = []struct {
	flag     string
	patterns []string
}{
	{"rate", []string{Poisson, Bursts, Ramp, Step}},
	{"duration", []string{Poisson, Bursts, Boundary, SlidingWorst, Ramp, Step}},
	{"on", []string{Bursts}},
	{"off", []string{Bursts}},
	{"seed", []string{Poisson, Step, Calendar}},
}

// PatternFlags returns why a flag of sluice simulate that set holds does
// not apply to pattern (a flag that shapes some patterns only is refused
// elsewhere, not ignored); nil when each applies.
func PatternFlags(set map[string]bool, pattern string) error {
	for _, c := range patternFlags {
		if set[c.flag] && !slices.Contains(c.patterns, pattern) {
			return fmt.Errorf("--%s does not apply to %s: only to %s", c.flag, pattern, strings.Join(c.patterns, ", "))
		}
	}
	return nil
}

// ReadCSVFile is ReadCSV of the file at path, its errors naming --csv.
func ReadCSVFile(path string, window int64) (arrivals []int64, start, end int64, err error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("--csv: %w", err)
	}
	defer file.Close()
	if arrivals, start, end, err = ReadCSV(file, window); err != nil {
		return nil, 0, 0, fmt.Errorf("--csv %s: %w", path, err)
	}
	return arrivals, start, end, nil
}

// FlagError rewrites the engine's and the simulator's field names in
// err as the flags of sluice simulate that set them.
func FlagError(err error) error {
	var re *algorithm.RangeError
	if errors.As(err, &re) {
		value := strconv.FormatInt(re.Value, 10)
		if re.Field == "window" {
			value = (time.Duration(re.Value) * time.Microsecond).String()
		}
		return fmt.Errorf("--%s %s: %s", re.Field, value, re.Rule)
	}
	var se *Error
	if errors.As(err, &se) {
		return fmt.Errorf("--%s %s: %s", se.Field, se.Value, se.Rule)
	}
	return err
}

// WriteChart writes res to path as an SVG, or as an HTML page with the
// SVG and the table, by path's extension.
func WriteChart(path string, res *Result, title string) error {
	var b bytes.Buffer
	if strings.HasSuffix(path, ".html") {
		fmt.Fprintf(&b, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>%s</title></head><body>\n", htmlEscape(title))
		if err := SVG(&b, res, title); err != nil {
			return err
		}
		b.WriteString("<pre>")
		var t bytes.Buffer
		WriteTable(&t, res)
		b.WriteString(htmlEscape(t.String()))
		b.WriteString("</pre></body></html>\n")
	} else if err := SVG(&b, res, title); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// AccuracyPolicies returns the policies of ACCURACY.md's table: the five
// algorithms at limit per window (µs), burst for the buckets (the limit
// when 0), and the fixed window aligned to the clock (align: clock, the
// Envoy rules' default) second. An error names the flag (FlagError).
func AccuracyPolicies(limit, window, burst int64) ([]Policy, error) {
	policies := Compare(limit, window, burst)
	aligned := policies[0] // fixed_window
	aligned.Name, aligned.Params.Aligned = "fixed_window align=clock", true
	policies = slices.Insert(policies, 1, aligned)
	for _, p := range policies {
		if err := p.Params.Check(p.Kind); err != nil {
			return nil, FlagError(err)
		}
	}
	return policies, nil
}

// Accuracy runs every pattern of Patterns (spec gives each one's shape),
// aimed at the first policy's limit and window, through policies,
// writes dir/PATTERN.svg for each and returns the Markdown table of
// ACCURACY.md.
func Accuracy(dir string, policies []Policy, spec func(name string) PatternSpec) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("--accuracy: %w", err)
	}
	aim := policies[0].Params
	var table strings.Builder
	table.WriteString(MarkdownHeader + "\n")
	for _, name := range Patterns {
		arrivals, start, end, err := Generate(spec(name), aim.Limit, aim.Window)
		if err != nil {
			return "", fmt.Errorf("pattern %s: %w", name, err)
		}
		res, err := Run(Spec{Start: start, End: end, Arrivals: arrivals, Policies: policies})
		if err != nil {
			return "", fmt.Errorf("pattern %s: %w", name, err)
		}
		for i := range res.Results {
			table.WriteString(MarkdownRow(name, &res.Results[i]) + "\n")
		}
		title := fmt.Sprintf("sluice simulate --pattern %s: %d requests over %v, %d per %v", name, len(arrivals), time.Duration(end-start)*time.Microsecond, aim.Limit, time.Duration(aim.Window)*time.Microsecond)
		if err := WriteChart(filepath.Join(dir, name+".svg"), res, title); err != nil {
			return "", fmt.Errorf("--accuracy: %w", err)
		}
	}
	return table.String(), nil
}
