package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/server/config"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

const benchSynopsis = "sluice bench [--store memory|redis --redis-url URL | --url URL --policy ID] [--mode allowed|denied|mixed | --policy-algorithm ALG --limit N --window D --burst N] [--subjects N] [--callers N] [--duration D] [--max-errors SHARE] [--json]"

// The modes of sluice bench: what share of its decisions its policy
// allows. Explicit --limit, --window or --burst make the mode "custom".
const (
	benchAllowed = "allowed" // limit 1e9 per second: nearly every decision allowed
	benchDenied  = "denied"  // limit 1 per hour: every decision after a subject's first denied
	benchMixed   = "mixed"   // half the subjects on each of the two: about half allowed
)

// benchFlags are the parsed flags of sluice bench.
type benchFlags struct {
	store, redisURL, redisAddrs, redisMode, redisPasswordEnv string
	url, policy, algorithm, mode                             string
	limit, burst                                             int64
	window, duration                                         time.Duration
	subjects, callers                                        int
	maxErrors                                                float64
	json                                                     bool
}

// benchReport is the summary sluice bench prints; --json prints it as is.
type benchReport struct {
	Target    string  `json:"target"` // "memory", "redis" or the server's URL
	Mode      string  `json:"mode"`   // allowed, denied, mixed; custom with explicit numbers; server with --url
	Policy    string  `json:"policy"`
	Algorithm string  `json:"algorithm,omitempty"`
	Limit     int64   `json:"limit,omitempty"`
	Window    string  `json:"window,omitempty"`
	Burst     int64   `json:"burst,omitempty"`
	Callers   int     `json:"callers"`
	Subjects  int     `json:"subjects"`
	Seconds   float64 `json:"seconds"`
	Decisions int64   `json:"decisions"`
	PerSecond float64 `json:"decisions_per_second"`
	Allowed   int64   `json:"allowed"`
	Denied    int64   `json:"denied"`
	// Other counts requests that got no decision: Incompatible,
	// Unavailable, Indeterminate outcomes, or HTTP answers other than 200
	// and 429 and transport errors.
	Other      int64            `json:"other"`
	OtherKinds map[string]int64 `json:"other_kinds,omitempty"`
	FirstError string           `json:"first_error,omitempty"`
	P50        float64          `json:"p50_ms"`
	P99        float64          `json:"p99_ms"`
	P999       float64          `json:"p999_ms"`
	// KeysDeleted is how many keys under the run's own prefix were
	// deleted from Redis at the end.
	KeysDeleted int64 `json:"redis_keys_deleted,omitempty"`
}

// bench is a load generator users point at their own store and policy:
// the embedded store, a Redis or Redis Cluster, or a running sluice serve.
func (a *app) bench(ctx context.Context, args []string) error {
	fs := newFlagSet("bench")
	var f benchFlags
	f.define(fs)
	if err := a.parseFlags(fs, benchSynopsis, args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if err := f.check(set); err != nil {
		return &usageError{msg: "bench: " + err.Error(), usage: "Usage: " + benchSynopsis + "\n\nRun \"sluice bench --help\" for the flags.\n"}
	}
	f.applyMode(set)

	runID := newRunID()
	// Subjects carry the run id, so two runs never share state.
	subjects := make([]string, f.subjects)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("bench-%s-%d", runID, i)
	}
	rep := &benchReport{Policy: f.policy, Mode: f.mode, Callers: f.callers, Subjects: f.subjects}
	var decide benchDecider
	var cleanup func(context.Context) (int64, error)
	if f.url != "" {
		rep.Target = f.url
		d, closeIdle := httpDecider(f.url, f.policy, subjects, f.callers)
		defer closeIdle()
		decide = d
	} else {
		d, clean, closeStore, err := a.storeDecider(&f, runID, subjects, rep)
		if err != nil {
			return err
		}
		defer closeStore()
		decide, cleanup = d, clean
	}

	fmt.Fprintln(a.stderr, f.header())
	res := a.benchLoad(ctx, decide, subjects, f.callers, f.duration)
	if cleanup != nil {
		// Leave nothing behind on the user's Redis, even after Ctrl-C.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		n, err := cleanup(cctx)
		cancel()
		rep.KeysDeleted = n
		if err != nil {
			fmt.Fprintf(a.stderr, "sluice bench: deleting the run's keys (prefix sluice-bench:%s:): %v\n", runID, err)
		}
	}
	res.fill(rep)
	if err := rep.write(a.stdout, f.json); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if answers := rep.Decisions + rep.Other; answers > 0 && float64(rep.Other) > f.maxErrors*float64(answers) {
		return &exitError{code: 1, err: fmt.Errorf("bench: %d of %d answers (%.1f%%) were errors, more than --max-errors %g; the first: %s", rep.Other, answers, 100*float64(rep.Other)/float64(answers), f.maxErrors, rep.FirstError)}
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
		f.mode = "server"
	case set["limit"] || set["window"] || set["burst"]:
		f.mode = "custom"
	case f.mode == benchDenied:
		f.limit, f.window = 1, time.Hour
	default: // allowed, and mixed's allowing half
		f.limit, f.window = benchAllowedLimit(f.algorithm), time.Second
	}
}

// benchAllowedLimit is the limit per second of the allowing policy: the
// most the algorithm takes (sliding_log keeps an entry per unit).
func benchAllowedLimit(algorithm string) int64 {
	if algorithm == sluice.SlidingLog.String() {
		return 100_000
	}
	return 1_000_000_000
}

// header is the line bench starts with: what it measures.
func (f *benchFlags) header() string {
	what := map[string]string{
		benchAllowed: fmt.Sprintf("nearly every decision is allowed (%s, limit %d per 1s); --mode denied or mixed measures denials", f.algorithm, f.limit),
		benchDenied:  fmt.Sprintf("every decision after a subject's first is denied (%s, limit 1 per 1h); --mode allowed or mixed for admissions", f.algorithm),
		benchMixed:   fmt.Sprintf("about half the decisions are allowed: half the subjects on %s limit %d per 1s, half on limit 1 per 1h (policy %s-denied)", f.algorithm, f.limit, f.policy),
		"custom":     fmt.Sprintf("the policy given: %s, limit %d per %s", f.algorithm, f.limit, f.window),
		"server":     fmt.Sprintf("policy %q as the server at %s configures it", f.policy, f.url),
	}[f.mode]
	return fmt.Sprintf("sluice bench: mode %s: %s; %d callers, %d subjects, %s", f.mode, what, f.callers, f.subjects, f.duration)
}

// define defines f's flags in fs.
func (f *benchFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.store, "store", "memory", "the store to drive through the library: memory or redis")
	fs.StringVar(&f.redisURL, "redis-url", "", "with --store redis: a redis:// or rediss:// `URL`")
	fs.StringVar(&f.redisAddrs, "redis-addrs", "", "with --store redis: comma-separated host:port seeds of a cluster (with --redis-mode cluster)")
	fs.StringVar(&f.redisMode, "redis-mode", "", "with --redis-addrs: cluster")
	fs.StringVar(&f.redisPasswordEnv, "redis-password-env", "", "the environment variable `NAME` that holds the Redis password")
	fs.StringVar(&f.url, "url", "", "drive POST /v1/check of a running sluice serve at this base `URL` instead of a store")
	fs.StringVar(&f.policy, "policy", "", "the policy `ID`: with --url, required, a policy of the server's config (the built-in example has demo, login, api); else its name (default bench)")
	fs.StringVar(&f.mode, "mode", benchAllowed, "what share the policy allows: allowed (nearly all), denied (all after each subject's first) or mixed (about half); --limit, --window or --burst instead give numbers of your own")
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

// storeDecider decides through the library over the store f names, with
// f's policy, which it describes in rep. cleanup, when not nil, deletes
// the run's keys; closeStore releases the store.
//
// In mode mixed every other subject is checked against a second policy,
// f.policy + "-denied", limit 1 per hour.
func (a *app) storeDecider(f *benchFlags, runID string, subjects []string, rep *benchReport) (decide benchDecider, cleanup func(context.Context) (int64, error), closeStore func(), err error) {
	rep.Target, rep.Algorithm, rep.Window = f.store, f.algorithm, f.window.String()
	alg, _ := config.ParseAlgorithm(f.algorithm) // checked
	p := sluice.Policy{ID: f.policy, Algorithm: alg, Limit: f.limit, Window: f.window, Burst: f.burst}
	if err := p.Validate(); err != nil {
		return nil, nil, nil, &usageError{msg: "bench: " + err.Error(), usage: "Usage: " + benchSynopsis + "\n"}
	}
	p = p.WithDefaults()
	rep.Limit, rep.Burst = p.Limit, p.Burst
	var st sluice.Store
	switch f.store {
	case "memory":
		ms, err := memstore.New(memstore.Options{Clock: a.clock})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("bench: %w", err)
		}
		st, closeStore = ms, func() { ms.Close() }
	case "redis":
		client, err := server.NewRedisClient(&config.Redis{URL: f.redisURL, Addrs: splitList(f.redisAddrs), Mode: f.redisMode, PasswordEnv: f.redisPasswordEnv}, a.getenv)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("bench: %w", err)
		}
		closeStore = func() { client.Close() }
		prefix := "sluice-bench:" + runID + ":"
		rs, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
		if err != nil {
			closeStore()
			return nil, nil, nil, fmt.Errorf("bench: %w", err)
		}
		if err := waitReady(rs, benchReadyWait); err != nil {
			rs.Close()
			closeStore()
			return nil, nil, nil, fmt.Errorf("bench: %w", err)
		}
		st = rs
		cleanup = func(ctx context.Context) (int64, error) { return deletePrefix(ctx, client, prefix) }
	}
	policies := []sluice.Policy{p}
	policyOf := map[string]string{}
	if f.mode == benchMixed {
		denying := sluice.Policy{ID: f.policy + "-denied", Algorithm: alg, Limit: 1, Window: time.Hour}
		policies = append(policies, denying)
		for i, s := range subjects {
			if i%2 == 1 {
				policyOf[s] = denying.ID
			}
		}
	}
	lim, err := sluice.New(st, policies, sluice.Options{})
	if err != nil {
		closeStore()
		return nil, nil, nil, fmt.Errorf("bench: %w", err)
	}
	decide = func(ctx context.Context, subject string) (sluice.Kind, error) {
		id := f.policy
		if other, ok := policyOf[subject]; ok {
			id = other
		}
		o := lim.Check(ctx, sluice.Request{Policy: id, Subject: subject})
		return o.Kind, o.Err
	}
	return decide, cleanup, closeStore, nil
}

// benchReadyWait bounds how long bench waits for Redis before a run.
const benchReadyWait = 5 * time.Second

// waitReady asks rs.Ready until it answers nil or wait has passed, and
// returns the last error that says what Redis answered (not the circuit
// breaker's). redisstore.New does not contact Redis; this makes a run
// measure decisions rather than the loading of the code on the first
// ones, and an unreachable Redis an error that names it.
func waitReady(rs *redisstore.Store, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var reason error
	for {
		err := rs.Ready(ctx)
		switch {
		case err == nil:
			return nil
		case reason == nil || !errors.Is(err, sluice.CircuitOpen):
			reason = err
		}
		select {
		case <-ctx.Done():
			return reason
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// write prints rep: as indented JSON, or as a table.
func (rep *benchReport) write(w io.Writer, asJSON bool) error {
	if !asJSON {
		rep.writeTable(w)
		return nil
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func (f *benchFlags) check(set map[string]bool) error {
	switch {
	case f.url != "" && (set["store"] || set["redis-url"] || set["redis-addrs"]):
		return errors.New("--url drives a running server: leave out --store and --redis-*")
	case f.url != "" && (set["policy-algorithm"] || set["limit"] || set["window"] || set["burst"] || set["mode"]):
		return errors.New("--url uses the server's policy as configured: name it with --policy and leave out --mode, --policy-algorithm, --limit, --window and --burst")
	case f.url != "" && f.policy == "":
		return errors.New("--url needs --policy ID, a policy of the server's config (the built-in example has demo, login and api)")
	case f.mode != benchAllowed && f.mode != benchDenied && f.mode != benchMixed:
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

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func newRunID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// benchDecider takes one decision for subject.
type benchDecider func(ctx context.Context, subject string) (sluice.Kind, error)

// httpDecider asks the server at base over keep-alive connections, one
// per caller.
func httpDecider(base, policy string, subjects []string, callers int) (benchDecider, func()) {
	tr := &http.Transport{MaxIdleConns: callers + 8, MaxIdleConnsPerHost: callers + 8, IdleConnTimeout: time.Minute, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := strings.TrimSuffix(base, "/") + "/v1/check"
	bodies := make(map[string][]byte, len(subjects))
	for _, s := range subjects {
		b, _ := json.Marshal(map[string]string{"policy": policy, "subject": s})
		bodies[s] = b
	}
	return func(ctx context.Context, subject string) (sluice.Kind, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[subject]))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		var answer struct {
			Outcome string `json:"outcome"`
			Reason  string `json:"reason"`
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return sluice.Allowed, nil
		case http.StatusTooManyRequests:
			return sluice.Denied, nil
		}
		json.Unmarshal(body, &answer)
		err = fmt.Errorf("POST %s: %s", url, resp.Status)
		if answer.Reason != "" {
			err = fmt.Errorf("%w: %s", err, answer.Reason)
		}
		switch answer.Outcome {
		case "unavailable":
			return sluice.Unavailable, err
		case "indeterminate":
			return sluice.Indeterminate, err
		case "incompatible":
			return sluice.Incompatible, err
		}
		return 0, err
	}, tr.CloseIdleConnections
}

// deletePrefix deletes every key under prefix on every master, one DEL per
// key (a cluster refuses DEL across slots), pipelined per SCAN batch. It
// stops after 100 000 SCAN calls per node.
func deletePrefix(ctx context.Context, client redis.UniversalClient, prefix string) (int64, error) {
	var deleted atomic.Int64
	sweep := func(ctx context.Context, c *redis.Client) error {
		var cursor uint64
		for range 100_000 {
			keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
			if err != nil {
				return fmt.Errorf("SCAN: %w", err)
			}
			if len(keys) > 0 {
				cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.Del(ctx, k)
					}
					return nil
				})
				if err != nil {
					return fmt.Errorf("DEL: %w", err)
				}
				for _, cmd := range cmds {
					deleted.Add(cmd.(*redis.IntCmd).Val())
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
		return errors.New("SCAN did not finish within 100000 calls")
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, sweep)
	case *redis.Client:
		err = sweep(ctx, c)
	default:
		err = fmt.Errorf("cannot scan a %T", client)
	}
	return deleted.Load(), err
}

// Latencies go into a histogram: exact below 64 ns, then 32 buckets per
// power of two (about 3 % wide) up to 2^40 ns.
const benchBuckets = 64 + 35*32

type latencies [benchBuckets]uint64

// add counts d. Its atomic add lets the progress line read the
// histogram while the caller runs.
func (h *latencies) add(d time.Duration) {
	ns := int64(d)
	if ns < 64 {
		atomic.AddUint64(&h[max(ns, 0)], 1)
		return
	}
	e := bits.Len64(uint64(ns)) - 6
	atomic.AddUint64(&h[min(64+(e-1)*32+int(ns>>e)-32, benchBuckets-1)], 1)
}

// merge adds what o holds now to h.
func (h *latencies) merge(o *latencies) {
	for i := range o {
		h[i] += atomic.LoadUint64(&o[i])
	}
}

// quantile returns the q-quantile in ms, from the middle of its bucket.
func (h *latencies) quantile(q float64) float64 {
	var total uint64
	for _, n := range h {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank, seen := uint64(q*float64(total-1))+1, uint64(0)
	for i, n := range h {
		if seen += n; seen < rank {
			continue
		}
		if i < 64 {
			return float64(i) / 1e6
		}
		e := (i-64)/32 + 1
		m := int64((i-64)%32 + 32)
		return (float64(m<<e) + float64(int64(1)<<e)/2) / 1e6
	}
	return 0
}

// benchCaller is one caller's tally; done is read by the progress line
// while the caller runs (the histogram keeps neighbouring callers' done
// counters on different cache lines).
type benchCaller struct {
	done, errs      atomic.Int64
	allowed, denied int64
	other           map[string]int64
	firstErr        error
	lat             latencies
}

type benchResult struct {
	elapsed time.Duration
	callers []benchCaller
}

// benchLoad runs callers goroutines against decide for dur (or until ctx
// is done), each on subjects picked at random, reporting progress on
// stderr. A decision in flight when dur ends is waited for and counted;
// one cut short by ctx is not.
func (a *app) benchLoad(ctx context.Context, decide benchDecider, subjects []string, callers int, dur time.Duration) *benchResult {
	var stop atomic.Bool
	timer := time.AfterFunc(dur, func() { stop.Store(true) })
	defer timer.Stop()
	res := &benchResult{callers: make([]benchCaller, callers)}
	var wg sync.WaitGroup
	start := time.Now()
	for c := range res.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bc := &res.callers[c]
			bc.other = map[string]int64{}
			rng := uint64(c+1) * 0x9E3779B97F4A7C15
			for !stop.Load() && ctx.Err() == nil {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				subj := subjects[rng%uint64(len(subjects))]
				t0 := time.Now()
				kind, err := decide(ctx, subj)
				d := time.Since(t0)
				if ctx.Err() != nil && kind != sluice.Allowed && kind != sluice.Denied {
					break // cut short by an interrupt: not a result
				}
				bc.lat.add(d)
				switch kind {
				case sluice.Allowed:
					bc.allowed++
				case sluice.Denied:
					bc.denied++
				default:
					name := "error"
					if kind != 0 {
						name = kind.String()
					}
					bc.other[name]++
					bc.errs.Add(1)
					if bc.firstErr == nil {
						bc.firstErr = err
					}
				}
				bc.done.Add(1)
			}
		}()
	}
	stopProgress := a.progress(res, start, dur)
	wg.Wait()
	res.elapsed = time.Since(start)
	stopProgress()
	return res
}

// progress draws a bar on stderr when it is a terminal, else writes a
// plain line every 5 s (every second for runs under 10 s). The returned
// func stops it.
func (a *app) progress(res *benchResult, start time.Time, dur time.Duration) func() {
	tty := isTerminal(a.stderr)
	every := 5 * time.Second
	switch {
	case tty:
		every = 200 * time.Millisecond
	case dur < 10*time.Second:
		every = time.Second
	}
	count := func() (n, errs int64, p99 float64) {
		var lat latencies
		for i := range res.callers {
			n += res.callers[i].done.Load()
			errs += res.callers[i].errs.Load()
			lat.merge(&res.callers[i].lat)
		}
		return n, errs, lat.quantile(0.99)
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				if tty {
					io.WriteString(a.stderr, "\r\033[K")
				}
				return
			case <-t.C:
			}
			el := time.Since(start)
			n, errs, p99 := count()
			rate := float64(n) / el.Seconds()
			left := max(dur-el, 0).Round(time.Second)
			if tty {
				frac := min(el.Seconds()/dur.Seconds(), 1)
				const width = 30
				full := int(frac * width)
				fmt.Fprintf(a.stderr, "\r\033[K[%s%s] %3.0f%%  %.0f decisions/s  p99 %s  %s errors  %s left", strings.Repeat("=", full), strings.Repeat(" ", width-full), frac*100, rate, fmtMS(p99), fmtCount(errs), left)
			} else {
				fmt.Fprintf(a.stderr, "sluice bench: %s of %s, %d answers, %.0f/s, p99 %s, %d errors, %s left\n", el.Round(time.Second/10), dur, n, rate, fmtMS(p99), errs, left)
			}
		}
	}()
	return func() { close(stop); <-finished }
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func fmtCount(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (r *benchResult) fill(rep *benchReport) {
	var lat latencies
	for i := range r.callers {
		c := &r.callers[i]
		rep.Allowed += c.allowed
		rep.Denied += c.denied
		for k, n := range c.other {
			if rep.OtherKinds == nil {
				rep.OtherKinds = map[string]int64{}
			}
			rep.OtherKinds[k] += n
			rep.Other += n
		}
		if rep.FirstError == "" && c.firstErr != nil {
			rep.FirstError = c.firstErr.Error()
		}
		lat.merge(&c.lat)
	}
	rep.Seconds = r.elapsed.Seconds()
	rep.Decisions = rep.Allowed + rep.Denied
	rep.PerSecond = float64(rep.Decisions) / rep.Seconds
	rep.P50, rep.P99, rep.P999 = lat.quantile(0.5), lat.quantile(0.99), lat.quantile(0.999)
}

func (rep *benchReport) writeTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("target", rep.Target)
	row("mode", rep.Mode)
	if rep.Algorithm != "" {
		burst := ""
		if rep.Algorithm == "token_bucket" || rep.Algorithm == "gcra" {
			burst = fmt.Sprintf(", burst %d", rep.Burst)
		}
		row("policy", fmt.Sprintf("%s: %s, %d per %s%s", rep.Policy, rep.Algorithm, rep.Limit, rep.Window, burst))
	} else {
		row("policy", rep.Policy+" (as the server configures it)")
	}
	row("callers", fmt.Sprint(rep.Callers))
	row("subjects", fmt.Sprint(rep.Subjects))
	row("duration", fmt.Sprintf("%.2fs", rep.Seconds))
	row("decisions/s", fmt.Sprintf("%.0f", rep.PerSecond))
	row("allowed", fmt.Sprint(rep.Allowed))
	row("denied", fmt.Sprint(rep.Denied))
	other := fmt.Sprint(rep.Other)
	if rep.Other > 0 {
		var parts []string
		for k, n := range rep.OtherKinds {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
		other += " (" + strings.Join(parts, ", ") + ")"
	}
	row("other", other)
	row("p50", fmtMS(rep.P50))
	row("p99", fmtMS(rep.P99))
	row("p99.9", fmtMS(rep.P999))
	if rep.KeysDeleted > 0 {
		row("redis keys deleted", fmt.Sprint(rep.KeysDeleted))
	}
	tw.Flush()
	if rep.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", rep.FirstError)
	}
}

func fmtMS(ms float64) string {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Microsecond / 10).String()
}
