// Command flood measures the memory of a real `sluice serve` on the
// embedded store the way a user sees it: it builds ../cmd/sluice, serves
// one policy, sends distinct subjects through POST /v1/check over
// keep-alive connections from a few callers, and samples the server's
// resident memory (/proc/PID/status: VmRSS, VmHWM for the peak) and its
// /metrics. Once without an evaluation_id, once with one per request
// (dedupe_ttl 1h, so none expires during the run: the worst case).
//
// From bench/ (docs/performance.md's memory section quotes the figures):
//
//	go run ./flood                       # 2 000 000 subjects per run
//	go run ./flood -subjects 200000      # a quicker look
//
// The policy is gcra, 100 per 24 h: one request leaves a state that stays
// live for 14 min, so within a run nothing expires and the states held
// are the subjects sent minus the states evicted; a sample of peeks
// (cost 0) checks that from outside.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bench/internal/proc"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

func main() { proc.Main("flood", run) }

type options struct {
	repo      string
	subjects  int
	callers   int
	runs      []string
	dedupeTTL time.Duration
	every     time.Duration
	peeks     int
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.repo, "repo", "..", "the main module, whose ./cmd/sluice is built")
	fs.IntVar(&o.subjects, "subjects", 2_000_000, "distinct subjects per run, one request each")
	fs.IntVar(&o.callers, "callers", 4, "concurrent callers, each on a keep-alive connection of its own")
	runs := fs.String("runs", "states,ids", "runs, comma-separated: states (no evaluation_id), ids (one per request)")
	fs.DurationVar(&o.dedupeTTL, "dedupe-ttl", time.Hour, "the policy's dedupe_ttl (1ms to 1h)")
	fs.DurationVar(&o.every, "every", 10*time.Second, "how often to print progress and memory")
	fs.IntVar(&o.peeks, "peeks", 10_000, "subjects sampled by a peek at the end, to count the states held")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.runs = strings.Split(*runs, ",")
	for _, r := range o.runs {
		if r != "states" && r != "ids" {
			return nil, fmt.Errorf("-runs: %q: must be states or ids", r)
		}
	}
	if o.subjects < 1 || o.callers < 1 || o.peeks < 0 || o.every <= 0 {
		return nil, fmt.Errorf("-subjects and -callers must be at least 1, -peeks at least 0, -every positive")
	}
	return &o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sluice-flood-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := servetest.Build(ctx, o.repo, dir, nil)
	if err != nil {
		return err
	}
	config := filepath.Join(dir, "flood.yaml")
	yaml := fmt.Sprintf("server:\n  listen: \"127.0.0.1:0\"\npolicies:\n  - id: api\n    algorithm: gcra\n    limit: 100\n    window: 24h\n    dedupe_ttl: %s\n", o.dedupeTTL)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		return err
	}
	var results []result
	for _, name := range o.runs {
		r, err := flood(ctx, o, bin, config, filepath.Join(dir, name+".log"), name == "ids", stderr)
		if err != nil {
			return fmt.Errorf("run %s: %w", name, err)
		}
		r.name = name
		results = append(results, r)
	}
	printResults(stdout, o, results)
	return nil
}
