package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/simulate"
)

const simulateSynopsis = "sluice simulate [--pattern NAME | --csv FILE] [--policy ALG[:LIMIT/WINDOW[:BURST]]]... [--limit N --window D --burst N] [--rate R] [--duration D] [--seed N] [--out FILE.svg|FILE.html] | --accuracy DIR | --local-quota [--instances N] [--seed N] [--limit N --window D --burst N]"

// simulateFlags are the parsed flags of sluice simulate.
type simulateFlags struct {
	pattern, csv, out, accuracy string
	policies                    []string
	limit, burst                int64
	localQuota                  bool
	instances                   int
	window, duration, on, off   time.Duration
	rate                        float64
	seed                        uint64
}

// simulate runs a traffic pattern through policies on a virtual clock,
// with the engine the stores run, and charts what each admitted.
func (a *app) simulate(args []string) error {
	fs := newFlagSet("simulate")
	var f simulateFlags
	f.define(fs)
	if err := a.parseFlags(fs, simulateSynopsis, args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	bad := func(err error) error {
		return &usageError{msg: "simulate: " + err.Error(), usage: "Usage: " + simulateSynopsis + "\n\nRun \"sluice simulate --help\" for the flags.\n"}
	}
	if err := f.check(set); err != nil {
		return bad(err)
	}
	window := f.window.Microseconds()
	if f.accuracy != "" {
		return a.accuracy(f, window)
	}
	if f.localQuota {
		return a.localQuota(f, set)
	}
	policies, err := f.parsePolicies(window)
	if err != nil {
		return bad(err)
	}
	aim := policies[0].Params
	var arrivals []int64
	var start, end int64
	source := "pattern " + f.pattern
	if f.csv != "" {
		file, err := os.Open(f.csv)
		if err != nil {
			return fmt.Errorf("simulate: --csv: %w", err)
		}
		arrivals, start, end, err = simulate.ReadCSV(file, aim.Window)
		file.Close()
		if err != nil {
			return fmt.Errorf("simulate: --csv %s: %w", f.csv, err)
		}
		source = "replay of " + filepath.Base(f.csv)
	} else {
		arrivals, start, end, err = simulate.Generate(f.patternSpec(f.pattern), aim.Limit, aim.Window)
		if err != nil {
			return bad(flagError(err))
		}
	}
	res, err := simulate.Run(simulate.Spec{Start: start, End: end, Arrivals: arrivals, Policies: policies})
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	if err := simulate.WriteTable(a.stdout, res); err != nil {
		return err
	}
	if f.out == "" {
		fmt.Fprintln(a.stdout, "\nno chart written: add --out FILE.svg")
		return nil
	}
	title := fmt.Sprintf("sluice simulate: %s, %d requests over %v", source, len(arrivals), time.Duration(end-start)*time.Microsecond)
	if err := writeChart(f.out, res, title); err != nil {
		return fmt.Errorf("simulate: --out: %w", err)
	}
	fmt.Fprintf(a.stdout, "\nchart written to %s\n", f.out)
	return nil
}

// define declares f's flags on fs.
func (f *simulateFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.pattern, "pattern", simulate.Poisson, "the offered traffic: "+strings.Join(simulate.LocalQuotaPatterns, ", "))
	fs.StringVar(&f.csv, "csv", "", "replay request timestamps from `FILE` (one per line, first field: RFC 3339 or Unix seconds) instead of --pattern")
	fs.Func("policy", "a policy to run, `ALG[:LIMIT/WINDOW[:BURST]]`, e.g. gcra or token_bucket:100/1m:20; repeat to compare (default: all five algorithms at --limit per --window)", func(s string) error {
		f.policies = append(f.policies, s)
		return nil
	})
	fs.Int64Var(&f.limit, "limit", 10, "the limit per --window of policies that give none, and what the patterns aim at (--local-quota: default 10000)")
	fs.DurationVar(&f.window, "window", 10*time.Second, "the window of policies that give none")
	fs.Int64Var(&f.burst, "burst", 0, "token_bucket and gcra: the bucket size of policies that give none (default: the limit)")
	fs.Float64Var(&f.rate, "rate", 0, "requests per second: poisson's mean, bursts' rate while on, ramp's final rate, step's rate in a flood (default: 2 × the limit's rate for poisson, 3 × for bursts and ramp, 4 × for step)")
	fs.DurationVar(&f.duration, "duration", 0, "virtual time the pattern spans (default: 30 windows for poisson, 3 for boundary and sliding_worst, 6 for the others)")
	fs.DurationVar(&f.on, "on", 0, "bursts: how long each burst lasts (default: half a window)")
	fs.DurationVar(&f.off, "off", 0, "bursts: the silence between bursts (default: one window)")
	fs.Uint64Var(&f.seed, "seed", 1, "poisson and step: the random seed; the same seed gives the same arrivals (--local-quota: also picks each request's instance)")
	fs.StringVar(&f.out, "out", "", "write the chart to `FILE`: .svg, or .html for the chart and the table in one page")
	fs.StringVar(&f.accuracy, "accuracy", "", "run ACCURACY.md's five patterns (not step) through all five algorithms, write one chart per pattern into `DIR` and print ACCURACY.md's table")
	fs.BoolVar(&f.localQuota, "local-quota", false, "run every built-in pattern (ACCURACY.md's and step) through the algorithms that take local quota, on --instances Limiters sharing one store, beside one Limiter without it, and print ACCURACY.md's local-quota table")
	fs.IntVar(&f.instances, "instances", 4, "--local-quota: how many Limiters, as processes, share the traffic")
}

func (f *simulateFlags) check(set map[string]bool) error {
	switch {
	case f.accuracy != "" && (set["pattern"] || set["csv"] || set["policy"] || set["out"] || set["rate"] || set["duration"] || set["on"] || set["off"]):
		return errors.New("--accuracy runs the built-in patterns at their defaults: leave out --pattern, --csv, --policy, --out, --rate, --duration, --on and --off")
	case f.localQuota && (f.accuracy != "" || set["pattern"] || set["csv"] || set["policy"] || set["out"] || set["rate"] || set["duration"] || set["on"] || set["off"]):
		return errors.New("--local-quota runs the built-in patterns at their defaults: leave out --accuracy, --pattern, --csv, --policy, --out, --rate, --duration, --on and --off")
	case set["instances"] && !f.localQuota:
		return errors.New("--instances applies only to --local-quota")
	case f.instances < 1 || f.instances > maxInstances:
		return fmt.Errorf("--instances %d: must be between 1 and %d", f.instances, maxInstances)
	case f.csv != "" && set["pattern"]:
		return errors.New("--csv replays a file: leave out --pattern")
	case f.out != "" && !strings.HasSuffix(f.out, ".svg") && !strings.HasSuffix(f.out, ".html"):
		return fmt.Errorf("--out %q: must end in .svg or .html", f.out)
	case f.window <= 0 || f.window%time.Microsecond != 0:
		return fmt.Errorf("--window %v: must be a positive whole number of microseconds", f.window)
	case f.rate < 0:
		return fmt.Errorf("--rate %v: must not be negative", f.rate)
	case f.duration < 0:
		return fmt.Errorf("--duration %v: must not be negative", f.duration)
	case f.on < 0:
		return fmt.Errorf("--on %v: must not be negative", f.on)
	case f.off < 0:
		return fmt.Errorf("--off %v: must not be negative", f.off)
	case len(f.policies) > simulate.MaxPolicies:
		return fmt.Errorf("--policy given %d times: at most %d", len(f.policies), simulate.MaxPolicies)
	}
	// Flags that shape one pattern only: refuse them elsewhere rather
	// than ignore them.
	pattern := f.pattern
	if f.csv != "" {
		pattern = "a --csv replay"
	}
	for _, c := range []struct {
		flag     string
		patterns []string
	}{
		{"rate", []string{simulate.Poisson, simulate.Bursts, simulate.Ramp, simulate.Step}},
		{"duration", []string{simulate.Poisson, simulate.Bursts, simulate.Boundary, simulate.SlidingWorst, simulate.Ramp, simulate.Step}},
		{"on", []string{simulate.Bursts}},
		{"off", []string{simulate.Bursts}},
		{"seed", []string{simulate.Poisson, simulate.Step}},
	} {
		if set[c.flag] && f.accuracy == "" && !f.localQuota && !slices.Contains(c.patterns, pattern) {
			return fmt.Errorf("--%s does not apply to %s: only to %s", c.flag, pattern, strings.Join(c.patterns, ", "))
		}
	}
	return nil
}

// parsePolicies returns the policies of --policy, or all five algorithms
// at --limit per --window.
func (f *simulateFlags) parsePolicies(window int64) ([]simulate.Policy, error) {
	if len(f.policies) == 0 {
		ps := simulate.Compare(f.limit, window, f.burst)
		for _, p := range ps {
			if err := p.Params.Check(p.Kind); err != nil {
				return nil, flagError(err)
			}
		}
		return ps, nil
	}
	var out []simulate.Policy
	for _, spec := range f.policies {
		p, err := parsePolicySpec(spec, f.limit, window, f.burst)
		if err != nil {
			return nil, fmt.Errorf("--policy %q: %w", spec, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePolicySpec reads ALG[:LIMIT/WINDOW[:BURST]].
func parsePolicySpec(spec string, limit, window, burst int64) (simulate.Policy, error) {
	parts := strings.Split(spec, ":")
	if len(parts) > 3 {
		return simulate.Policy{}, errors.New("want ALG[:LIMIT/WINDOW[:BURST]], e.g. token_bucket:100/1m:20")
	}
	kind, err := simulate.ParseKind(parts[0])
	if err != nil {
		return simulate.Policy{}, err
	}
	name := parts[0]
	if len(parts) >= 2 {
		l, w, ok := strings.Cut(parts[1], "/")
		if !ok {
			return simulate.Policy{}, fmt.Errorf("numbers %q: want LIMIT/WINDOW, e.g. 100/1m", parts[1])
		}
		if limit, err = strconv.ParseInt(l, 10, 64); err != nil {
			return simulate.Policy{}, fmt.Errorf("limit %q: want a whole number", l)
		}
		d, err := time.ParseDuration(w)
		if err != nil || d <= 0 || d%time.Microsecond != 0 {
			return simulate.Policy{}, fmt.Errorf("window %q: want a positive duration of whole microseconds, e.g. 10s or 1m", w)
		}
		window = d.Microseconds()
		name += ":" + parts[1]
		burst = 0
	}
	if len(parts) == 3 {
		if kind != algorithm.KindTokenBucket && kind != algorithm.KindGCRA {
			return simulate.Policy{}, fmt.Errorf("burst %q: applies only to token_bucket and gcra", parts[2])
		}
		if burst, err = strconv.ParseInt(parts[2], 10, 64); err != nil {
			return simulate.Policy{}, fmt.Errorf("burst %q: want a whole number", parts[2])
		}
		name += ":" + parts[2]
	}
	if burst == 0 || kind != algorithm.KindTokenBucket && kind != algorithm.KindGCRA {
		burst = limit
	}
	p := simulate.Policy{Name: name, Kind: kind, Params: algorithm.Params{Limit: limit, Window: window, Burst: burst}}
	if err := p.Params.Check(kind); err != nil {
		return simulate.Policy{}, flagError(err)
	}
	return p, nil
}

// flagError rewrites the engine's and the simulator's field names as the
// flags that set them.
func flagError(err error) error {
	var re *algorithm.RangeError
	if errors.As(err, &re) {
		value := strconv.FormatInt(re.Value, 10)
		if re.Field == "window" {
			value = (time.Duration(re.Value) * time.Microsecond).String()
		}
		return fmt.Errorf("--%s %s: %s", re.Field, value, re.Rule)
	}
	var se *simulate.Error
	if errors.As(err, &se) {
		return fmt.Errorf("--%s %s: %s", se.Field, se.Value, se.Rule)
	}
	return err
}

func (f *simulateFlags) patternSpec(name string) simulate.PatternSpec {
	return simulate.PatternSpec{Name: name, Rate: f.rate, Duration: f.duration.Microseconds(), On: f.on.Microseconds(), Off: f.off.Microseconds(), Seed: f.seed}
}

// writeChart writes res as an SVG, or as an HTML page with the SVG and
// the table, by path's extension.
func writeChart(path string, res *simulate.Result, title string) error {
	var b bytes.Buffer
	if strings.HasSuffix(path, ".html") {
		fmt.Fprintf(&b, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>%s</title></head><body>\n", htmlEscape(title))
		if err := simulate.SVG(&b, res, title); err != nil {
			return err
		}
		b.WriteString("<pre>")
		var t bytes.Buffer
		simulate.WriteTable(&t, res)
		b.WriteString(htmlEscape(t.String()))
		b.WriteString("</pre></body></html>\n")
	} else if err := simulate.SVG(&b, res, title); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// accuracy runs every built-in pattern through the five algorithms at
// --limit per --window, and the fixed window aligned to the clock
// (align: clock, the Envoy rules' default), writes dir/PATTERN.svg for
// each and prints the Markdown table of ACCURACY.md.
func (a *app) accuracy(f simulateFlags, window int64) error {
	policies := simulate.Compare(f.limit, window, f.burst)
	aligned := policies[0] // fixed_window
	aligned.Name, aligned.Params.Aligned = "fixed_window align=clock", true
	policies = slices.Insert(policies, 1, aligned)
	for _, p := range policies {
		if err := p.Params.Check(p.Kind); err != nil {
			return &usageError{msg: "simulate: " + flagError(err).Error(), usage: "Usage: " + simulateSynopsis + "\n"}
		}
	}
	if err := os.MkdirAll(f.accuracy, 0o755); err != nil {
		return fmt.Errorf("simulate: --accuracy: %w", err)
	}
	var table strings.Builder
	table.WriteString(simulate.MarkdownHeader + "\n")
	for _, name := range simulate.Patterns {
		ps := f.patternSpec(name)
		arrivals, start, end, err := simulate.Generate(ps, f.limit, window)
		if err != nil {
			return fmt.Errorf("simulate: pattern %s: %w", name, err)
		}
		res, err := simulate.Run(simulate.Spec{Start: start, End: end, Arrivals: arrivals, Policies: policies})
		if err != nil {
			return fmt.Errorf("simulate: pattern %s: %w", name, err)
		}
		for i := range res.Results {
			table.WriteString(simulate.MarkdownRow(name, &res.Results[i]) + "\n")
		}
		title := fmt.Sprintf("sluice simulate --pattern %s: %d requests over %v, %d per %v", name, len(arrivals), time.Duration(end-start)*time.Microsecond, f.limit, f.window)
		if err := writeChart(filepath.Join(f.accuracy, name+".svg"), res, title); err != nil {
			return fmt.Errorf("simulate: --accuracy: %w", err)
		}
	}
	_, err := io.WriteString(a.stdout, table.String())
	return err
}
