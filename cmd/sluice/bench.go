package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/bench"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/wiring"
)

const benchSynopsis = "sluice bench [--store memory|redis --redis-url URL | --url URL --policy ID [--token-env NAME] [--ca-file PATH]] [--mode allowed|denied|mixed | --policy-algorithm ALG --limit N --window D --burst N] [--subjects N] [--callers N] [--duration D] [--max-errors SHARE] [--json]"

// benchFlags are the parsed flags of sluice bench.
type benchFlags struct {
	store, redisURL, redisAddrs, redisMode, redisPasswordEnv string
	url, policy, algorithm, mode, tokenEnv, caFile           string
	limit, burst                                             int64
	window, duration                                         time.Duration
	subjects, callers                                        int
	maxErrors                                                float64
	json                                                     bool
}

// bench is a load generator users point at their own store and policy:
// the embedded store, a Redis or Redis Cluster, or a running sluice serve.
func (a *app) bench(ctx context.Context, args []string) error {
	fs := newFlagSet("bench")
	var f benchFlags
	f.define(fs)
	if err := a.parseFlags(fs, benchSynopsis, args); err != nil {
		return err // errHelp after -h: run answers nil
	}
	set := flagsSet(fs)
	if err := f.check(set); err != nil {
		return &usageError{msg: "bench: " + err.Error(), usage: "Usage: " + benchSynopsis + "\n\nRun \"sluice bench --help\" for the flags.\n"}
	}
	f.applyMode(set)

	alg, _ := config.ParseAlgorithm(f.algorithm) // checked
	b := bench.Load{URL: f.url, TokenEnv: f.tokenEnv, CAFile: f.caFile, Store: config.Store{Type: f.store}, Getenv: a.getenv, Clock: a.clock, Mode: f.mode, Subjects: f.subjects, Callers: f.callers, Duration: f.duration, Progress: a.stderr,
		Policy: sluice.Policy{ID: f.policy, Algorithm: alg, Limit: f.limit, Window: f.window, Burst: f.burst}}
	if f.store == config.StoreRedis {
		b.Store.Redis = &config.Redis{URL: f.redisURL, Addrs: wiring.SplitList(f.redisAddrs), Mode: f.redisMode, PasswordEnv: f.redisPasswordEnv}
	}
	if err := b.Policy.Validate(); err != nil && f.url == "" {
		return &usageError{msg: "bench: " + err.Error(), usage: "Usage: " + benchSynopsis + "\n"}
	}
	rep, err := b.Run(ctx)
	if err != nil {
		return err
	}
	if err := rep.Write(a.stdout, f.json); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := rep.TooManyErrors(f.maxErrors); err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}

// applyMode sets the policy's numbers of f.mode unless the flags set
// them, in which case the mode is "custom"; with --url it is "server".
func (f *benchFlags) applyMode(set map[string]bool) {
	if f.policy == "" {
		f.policy = "bench"
	}
	switch {
	case f.url != "":
		f.mode = bench.Server
	case set["limit"] || set["window"] || set["burst"]:
		f.mode = bench.Custom
	default:
		f.limit, f.window = bench.Numbers(f.mode, f.algorithm)
	}
}

// define defines f's flags in fs.
func (f *benchFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.store, "store", "memory", "the store to drive through the library: memory or redis")
	fs.StringVar(&f.redisURL, "redis-url", "", "with --store redis: a redis:// or rediss:// `URL`")
	fs.StringVar(&f.redisAddrs, "redis-addrs", "", "with --store redis: comma-separated host:port seeds of a cluster (with --redis-mode cluster)")
	fs.StringVar(&f.redisMode, "redis-mode", "", "with --redis-addrs: cluster")
	fs.StringVar(&f.redisPasswordEnv, "redis-password-env", "", "the environment variable `NAME` that holds the Redis password")
	fs.StringVar(&f.url, "url", "", "drive POST /v1/check of a running sluice serve at this base `URL` instead of a store")
	fs.StringVar(&f.tokenEnv, "token-env", "", "with --url: the environment variable `NAME` holding a bearer token of the server (server.auth.tokens, scope check)")
	fs.StringVar(&f.caFile, "ca-file", "", "with an https --url: a PEM file (`PATH`) of the certificates that sign the server's, e.g. a private CA's")
	fs.StringVar(&f.policy, "policy", "", "the policy `ID`: with --url, required, a policy of the server's config (the built-in example has demo, login, api); else its name (default bench)")
	fs.StringVar(&f.mode, "mode", bench.Allowed, "what share the policy allows: allowed (nearly all), denied (all after each subject's first) or mixed (about half); --limit, --window or --burst instead give numbers of your own")
	fs.Float64Var(&f.maxErrors, "max-errors", 0.01, "exit 1 when more than this `SHARE` (0 to 1) of the answers are errors rather than decisions, naming the first")
	fs.StringVar(&f.algorithm, "policy-algorithm", "gcra", "the policy's algorithm: fixed_window, sliding_log, sliding_window, token_bucket or gcra")
	fs.Int64Var(&f.limit, "limit", 100, "the policy's limit per --window")
	fs.DurationVar(&f.window, "window", time.Second, "the policy's window")
	fs.Int64Var(&f.burst, "burst", 0, "token_bucket and gcra: the bucket size (default: --limit)")
	fs.IntVar(&f.subjects, "subjects", 1000, "distinct subjects the callers pick from at random")
	fs.IntVar(&f.callers, "callers", 16, "concurrent callers")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long to run")
	fs.BoolVar(&f.json, "json", false, "print the summary as JSON")
}

func (f *benchFlags) check(set map[string]bool) error {
	switch {
	case f.url != "" && (set["store"] || set["redis-url"] || set["redis-addrs"]):
		return errors.New("--url drives a running server: leave out --store and --redis-*")
	case f.url != "" && (set["policy-algorithm"] || set["limit"] || set["window"] || set["burst"] || set["mode"]):
		return errors.New("--url uses the server's policy as configured: name it with --policy and leave out --mode, --policy-algorithm, --limit, --window and --burst")
	case f.url == "" && (f.tokenEnv != "" || f.caFile != ""), f.caFile != "" && !strings.HasPrefix(f.url, "https://"):
		return errors.New("--token-env and --ca-file are for a server: they need --url (--ca-file an https:// one)")
	case f.url != "" && f.policy == "":
		return errors.New("--url needs --policy ID, a policy of the server's config (the built-in example has demo, login and api)")
	case f.mode != bench.Allowed && f.mode != bench.Denied && f.mode != bench.Mixed:
		return fmt.Errorf("--mode %q: want allowed, denied or mixed", f.mode)
	case set["mode"] && (set["limit"] || set["window"] || set["burst"]):
		return errors.New("--mode picks the policy's numbers: leave out --limit, --window and --burst, or --mode")
	case !(f.maxErrors >= 0 && f.maxErrors <= 1):
		return fmt.Errorf("--max-errors %g: want a share from 0 to 1, such as 0.01", f.maxErrors)
	case f.url != "" && !strings.HasPrefix(f.url, "http://") && !strings.HasPrefix(f.url, "https://"):
		return fmt.Errorf("--url %q: want http://host:port", f.url)
	case f.url == "" && f.store != "memory" && f.store != "redis":
		return fmt.Errorf("--store %q: want memory or redis", f.store)
	case f.store == "redis" && f.url == "" && (f.redisURL == "") == (f.redisAddrs == ""):
		return errors.New("--store redis needs --redis-url, or --redis-addrs with --redis-mode cluster")
	case f.redisAddrs != "" && f.redisMode != config.ModeCluster:
		return errors.New("--redis-addrs needs --redis-mode cluster")
	case f.store != "redis" && (f.redisURL != "" || f.redisAddrs != ""):
		return errors.New("--redis-url and --redis-addrs need --store redis")
	case f.subjects < 1 || f.subjects > 10_000_000:
		return fmt.Errorf("--subjects %d: want 1 to 10000000", f.subjects)
	case f.callers < 1 || f.callers > 10_000:
		return fmt.Errorf("--callers %d: want 1 to 10000", f.callers)
	case f.duration <= 0 || f.duration > 24*time.Hour:
		return fmt.Errorf("--duration %v: want more than 0 and at most 24h", f.duration)
	}
	if f.url == "" {
		if _, err := config.ParseAlgorithm(f.algorithm); err != nil {
			return fmt.Errorf("--policy-algorithm: %w", err)
		}
	}
	return nil
}
