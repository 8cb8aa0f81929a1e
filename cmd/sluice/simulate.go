package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

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
		return err // errHelp after -h: run answers nil
	}
	set := flagsSet(fs)
	bad := simulateUsage
	if err := f.check(set); err != nil {
		return bad(err)
	}
	if f.pattern == simulate.Calendar { // its own policies: only --seed applies
		return simulate.WriteCalendar(a.stdout, f.seed, set, bad)
	}
	if f.accuracy != "" {
		return a.accuracy(f, f.window.Microseconds())
	}
	if f.localQuota {
		return a.localQuota(f, set)
	}
	if f.pattern == simulate.PostHocPattern {
		return simulate.WritePostHoc(a.stdout, set, f.limit, f.window.Microseconds(), f.burst, f.seed)
	}
	policies, err := simulate.ParsePolicies(f.policies, f.limit, f.window.Microseconds(), f.burst)
	if err != nil {
		return bad(err)
	}
	aim := policies[0].Params
	var arrivals []int64
	var start, end int64
	source := "pattern " + f.pattern
	if f.csv != "" {
		if arrivals, start, end, err = simulate.ReadCSVFile(f.csv, aim.Window); err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		source = "replay of " + filepath.Base(f.csv)
	} else {
		arrivals, start, end, err = simulate.Generate(f.patternSpec(f.pattern), aim.Limit, aim.Window)
		if err != nil {
			return bad(simulate.FlagError(err))
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
	if err := simulate.WriteChart(f.out, res, title); err != nil {
		return fmt.Errorf("simulate: --out: %w", err)
	}
	fmt.Fprintf(a.stdout, "\nchart written to %s\n", f.out)
	return nil
}

// define declares f's flags on fs.
func (f *simulateFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.pattern, "pattern", simulate.Poisson, "the offered traffic: "+strings.Join(simulate.LocalQuotaPatterns, ", ")+", or calendar (a Berlin month with a DST change, through periods: ACCURACY.md's calendar table; only --seed applies)")
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
	// Flags that shape one pattern only are refused elsewhere, not ignored.
	pattern := f.pattern
	if f.csv != "" {
		pattern = "a --csv replay"
	}
	if f.accuracy != "" || f.localQuota || pattern == simulate.PostHocPattern {
		return nil
	}
	return simulate.PatternFlags(set, pattern)
}

func (f *simulateFlags) patternSpec(name string) simulate.PatternSpec {
	return simulate.PatternSpec{Name: name, Rate: f.rate, Duration: f.duration.Microseconds(), On: f.on.Microseconds(), Off: f.off.Microseconds(), Seed: f.seed}
}

// accuracy runs ACCURACY.md's patterns through its policies at --limit per --window,
// writes a chart per pattern into --accuracy and prints the table.
func (a *app) accuracy(f simulateFlags, window int64) error {
	policies, err := simulate.AccuracyPolicies(f.limit, window, f.burst)
	if err != nil {
		return simulateUsage(err)
	}
	table, err := simulate.Accuracy(f.accuracy, policies, f.patternSpec)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	_, err = io.WriteString(a.stdout, table)
	return err
}

// localQuota runs every built-in pattern at --limit (default
// simulate.LocalQuotaLimit) per --window through the algorithms that take
// local quota, on --instances Limiters, and prints ACCURACY.md's
// local-quota table.
func (a *app) localQuota(f simulateFlags, set map[string]bool) error {
	limit := f.limit
	if !set["limit"] {
		limit = simulate.LocalQuotaLimit
	}
	policies, err := simulate.LocalQuotaPolicies(limit, f.window, f.burst)
	if err != nil {
		return simulateUsage(err)
	}
	table, err := simulate.LocalQuotaTable(policies, f.instances, f.seed, f.patternSpec)
	if err != nil {
		return fmt.Errorf("simulate: --local-quota: %w", err)
	}
	_, err = io.WriteString(a.stdout, table)
	return err
}

// simulateUsage is a usage error of sluice simulate: err, and the synopsis.
func simulateUsage(err error) error {
	return &usageError{msg: "simulate: " + err.Error(), usage: "Usage: " + simulateSynopsis + "\n\nRun \"sluice simulate --help\" for the flags.\n"}
}

// maxInstances bounds --instances.
const maxInstances = 64
