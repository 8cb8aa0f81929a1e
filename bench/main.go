// Command bench runs sluice and its peers side by side against one
// redis-server it starts itself on a free loopback port, and prints one
// markdown table per cell (or JSON with -json), the Redis memory one
// subject takes per limiter, the check API of a real `sluice serve` end
// to end, and optionally an SVG chart of decisions/s against callers.
//
// BENCHMARKS.md at the repository root holds the command that reproduces
// it and the figures of the last full run. A quick run:
//
//	cd bench && go run . -callers 1,64 -subjects 10000 -mode allowed -duration 3s
//
// -json prints everything measured; -render FILE prints the tables (and
// with -svg the chart) of such a file again without measuring.
//
// -hot allowed,reached measures one hot subject instead, shared by -procs
// processes (the command run again, each its own limiter and client) of
// -callers callers each, sluice with and without local quota beside
// redis_rate and ulule (see hot.go):
//
//	cd bench && go run . -hot allowed,reached
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	callers, subjects []int
	modes             []mode
	only              *regexp.Regexp
	rows              *regexp.Regexp
	run               runOptions
	pool              int
	passes            int
	json              bool
	cpuProfile        string
	svg               string
	http              bool
	httpAlgorithm     string
	netClient         bool
	redisServer       string
	redisAddr         string
	callgrindPID      int
	beside            string
	rls               bool
	onlyRLS           bool
	envoyRatelimit    string
	rlsLocalQuota     bool
	render            string
	hot               hotOptions
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	callers := fs.String("callers", "1,16,64,256", "concurrent callers per cell, comma-separated")
	subjects := fs.String("subjects", "1,10000", "subjects per cell, comma-separated (1 is one hot subject)")
	modes := fs.String("mode", "allowed,denied", "limits per cell: allowed (a limit never reached), denied (1 per hour)")
	only := fs.String("limiters", "", "run only the limiters whose name matches this `regexp`")
	rows := fs.String("rows", "", "with -http: run only the check API rows whose name matches this `regexp` (e.g. 'memstore.*(CheckStream|sluiceclient)')")
	fs.DurationVar(&c.run.duration, "duration", 5*time.Second, "measured time per cell (the warm-up comes on top)")
	fs.DurationVar(&c.run.warmup, "warmup", time.Second, "unmeasured load before each cell, after every subject was touched once")
	fs.IntVar(&c.passes, "passes", 1, "run every cell this many times, interleaved, and keep the pass with the median decisions/s")
	fs.IntVar(&c.pool, "pool", 20, "connections in the one go-redis client every Redis limiter shares")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of markdown")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write this process's CPU profile (the load generator's: clients, in-process limiters) to `FILE`; the server's own is BenchmarkChecksAPITCP's in internal/server")
	fs.StringVar(&c.svg, "svg", "", "write the chart of the 10 000-subject mostly-allowed cells to `FILE`")
	fs.BoolVar(&c.http, "http", true, "also drive POST /v1/check of a real sluice serve (built from ../cmd/sluice)")
	fs.StringVar(&c.httpAlgorithm, "http-algorithm", "gcra", "the algorithm of the check API's policy")
	fs.BoolVar(&c.netClient, "net-client", false, "drive the check API with net/http's client instead of plain keep-alive TCP (rawDecide): the client of earlier rounds, as CPU-hungry as the server")
	fs.BoolVar(&c.rls, "rls", false, "with -http: also drive sluice serve's Envoy rate-limit service (gRPC ShouldRateLimit) on Redis")
	fs.BoolVar(&c.onlyRLS, "only-rls", false, "with -rls: skip the check API and proxy rows")
	fs.BoolVar(&c.rlsLocalQuota, "rls-local-quota", false, "with -rls: also measure sluice serve with sluice_local_quota: true on the rule, a row of its own (allowed mode; with -subjects 1, one hot descriptor)")
	fs.StringVar(&c.envoyRatelimit, "envoy-ratelimit", "", "with -rls: the envoyproxy/ratelimit service binary (`BIN`) to measure beside it on the same Redis, e.g. built by go build github.com/envoyproxy/ratelimit/src/service_cmd")
	fs.StringVar(&c.redisServer, "redis-server", "", "the redis-server binary (default: the one on PATH)")
	fs.StringVar(&c.redisAddr, "redis", "", "use the redis-server already listening on this loopback `ADDR` (host:port) instead of starting one; every cell flushes it")
	fs.IntVar(&c.callgrindPID, "callgrind-pid", 0, "the `PID` of the -redis server, started under callgrind by rediscg start PORT: count its instructions in each cell's measured phase")
	fs.Int64Var(&c.run.decisions, "decisions", 0, "end each cell's measured phase after this many decisions (or -duration, whichever comes first); 0: by -duration only. Size callgrind runs by count")
	fs.DurationVar(&allowedWindow, "window", time.Second, "the window of the allowed mode's limits, at 1 000 000 per second (sliding_log: 100 000 per window). Under callgrind, where a subject comes back after tens of seconds, a longer one keeps its state live as it is without")
	fs.StringVar(&c.beside, "beside", "", "with -render: take decisions/s and CPU for the instruction tables from this other -json `FILE` (the same cells run without callgrind)")
	fs.StringVar(&c.render, "render", "", "measure nothing: print the tables (and -svg) of the -json output saved in `FILE`")
	hot := fs.String("hot", "", "measure only the one-hot-subject cells of local quota: `CELLS` allowed (a limit never reached), reached (-hot-limit offered -hot-offer times over), or allowed,reached; -callers is then the callers of each of -procs processes (default 16)")
	fs.IntVar(&c.hot.procs, "procs", 4, "with -hot: the processes, each its own limiter and client, that share the hot subject")
	fs.Int64Var(&c.hot.limit, "hot-limit", 2000, "with -hot reached: the limit per -hot-window")
	fs.DurationVar(&c.hot.window, "hot-window", time.Second, "with -hot reached: the window (gcra: the limit's period)")
	fs.Float64Var(&c.hot.offer, "hot-offer", 4, "with -hot reached: the load offered by all processes together, in limits")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if c.callers, err = ints(*callers, 1, 4096); err != nil {
		return nil, fmt.Errorf("-callers: %w", err)
	}
	if c.subjects, err = ints(*subjects, 1, 1_000_000); err != nil {
		return nil, fmt.Errorf("-subjects: %w", err)
	}
	for _, m := range strings.Split(*modes, ",") {
		switch mode(m) {
		case allowedMode, deniedMode:
			c.modes = append(c.modes, mode(m))
		default:
			return nil, fmt.Errorf("-mode %q: must be allowed, denied or both", m)
		}
	}
	if c.only, err = regexp.Compile(*only); err != nil {
		return nil, fmt.Errorf("-limiters: %w", err)
	}
	if c.rows, err = regexp.Compile(*rows); err != nil {
		return nil, fmt.Errorf("-rows: %w", err)
	}
	if c.run.duration <= 0 || c.run.duration > 10*time.Minute || c.run.warmup < 0 || c.run.warmup > time.Minute {
		return nil, errors.New("-duration must be in (0, 10m] and -warmup in [0, 1m]")
	}
	if c.passes < 1 || c.passes > 9 {
		return nil, errors.New("-passes must be between 1 and 9")
	}
	if c.callgrindPID != 0 && c.redisAddr == "" {
		return nil, errors.New("-callgrind-pid needs -redis, the address of that server")
	}
	if c.run.decisions < 0 {
		return nil, errors.New("-decisions must not be negative")
	}
	if allowedWindow < time.Millisecond || allowedWindow > time.Hour {
		return nil, errors.New("-window must be between 1ms and 1h")
	}
	if c.pool < 1 || c.pool > 1000 {
		return nil, errors.New("-pool must be between 1 and 1000")
	}
	if *hot != "" {
		callersSet := false
		fs.Visit(func(f *flag.Flag) { callersSet = callersSet || f.Name == "callers" })
		if err := parseHot(&c, *hot, callersSet); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

func ints(s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("%q: want integers between %d and %d", f, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

// report is everything one run measured; -json prints it as is.
type report struct {
	Machine machine        `json:"machine"`
	Results []result       `json:"results"`
	Memory  []memoryResult `json:"memory"`
	HTTP    []result       `json:"check_api,omitempty"`
	// Hot is what -hot measured (then the only thing measured).
	Hot *hotReport `json:"hot,omitempty"`
	// Beside is the run -beside names (the same cells without callgrind),
	// whose decisions/s and CPU the instruction tables show.
	Beside *report `json:"beside,omitempty"`
}

type machine struct {
	Date       string `json:"date"`
	Command    string `json:"command"`
	CPU        string `json:"cpu"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	Redis      string `json:"redis"`
	Duration   string `json:"duration_per_cell"`
	Warmup     string `json:"warmup_per_cell"`
	Pool       int    `json:"pool"`
	Passes     int    `json:"passes"`
}

func describeMachine(c *config, redisBin string, args []string) machine {
	m := machine{
		Date:       time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Command:    strings.TrimSpace("go run . " + strings.Join(args, " ")),
		CPUs:       runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go:         runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		Duration:   c.run.duration.String(),
		Warmup:     c.run.warmup.String(),
		Pool:       c.pool,
		Passes:     c.passes,
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command(redisBin, "--version").Output(); err == nil {
		m.Redis = strings.TrimSpace(string(out))
	}
	return m
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 2 && args[0] == childArg {
		return runHotChild(ctx, args[1], os.Stdin, stdout)
	}
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.render != "" {
		return render(cfg, stdout)
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	redisBin, err := lookRedis(cfg.redisServer)
	if err != nil {
		return err
	}
	addr := cfg.redisAddr
	if addr == "" {
		// Without persistence, on a free loopback port, stopped by its PID.
		srv, err := redistest.StartServerWith(redisBin, "")
		if err != nil {
			return err
		}
		defer srv.Stop()
		addr = srv.Addr
		fmt.Fprintf(stderr, "redis-server %s on %s (pid %d)\n", redisBin, srv.Addr, srv.PID())
	} else if err := checkLoopback(addr); err != nil {
		return err
	}

	if len(cfg.hot.cells) > 0 {
		admin := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2})
		defer admin.Close()
		rep := report{Machine: describeMachine(cfg, redisBin, args)}
		if rep.Hot, err = runHot(ctx, cfg, addr, admin, stderr); err != nil {
			return err
		}
		return output(cfg, &rep, stdout)
	}

	maxSubjects := 1
	for _, n := range cfg.subjects {
		maxSubjects = max(maxSubjects, n)
	}
	e := &env{
		client:   redis.NewClient(&redis.Options{Addr: addr, PoolSize: cfg.pool}),
		admin:    redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2}),
		trips:    &tripHook{},
		subjects: newSubjects(maxSubjects),
	}
	defer e.client.Close()
	defer e.admin.Close()
	e.client.AddHook(e.trips)
	if cfg.callgrindPID != 0 {
		if e.cg, err = newCallgrind(cfg.callgrindPID); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "counting the instructions of redis-server pid %d under callgrind (dumps in %s)\n", e.cg.pid, e.cg.dir)
	}

	var targets []target
	for _, t := range allTargets() {
		if cfg.only.MatchString(t.name) {
			targets = append(targets, t)
		}
	}
	rep := report{Machine: describeMachine(cfg, redisBin, args)}
	var cells []cell
	for _, m := range cfg.modes {
		for _, s := range cfg.subjects {
			for _, c := range cfg.callers {
				cells = append(cells, cell{callers: c, subjects: s, mode: m})
			}
		}
	}
	total := 0
	for _, c := range cells {
		for _, t := range targets {
			if t.runsIn(c.mode, cfg.modes[0]) {
				total++
			}
		}
	}
	total *= cfg.passes
	done := 0
	// passes[i] holds every pass's result of the i-th (cell, target).
	var passes [][]result
	for pass := range cfg.passes {
		i := 0
		for _, c := range cells {
			for _, t := range targets {
				// The floors set no limits: they run in the first mode's cells only.
				if !t.runsIn(c.mode, cfg.modes[0]) {
					continue
				}
				done++
				r, err := runCell(ctx, e, t, c, cfg.run)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", c, t.name, err)
				}
				fmt.Fprintf(stderr, "[%d/%d] %s: %-40s %10.0f decisions/s  p99 %7.0f µs  redis %5.1f µs/dec %8.0f instr/dec %5.2f socket ev/dec  errors %d\n",
					done, total, c, t.name, r.PerSecond, r.P99US, r.RedisCPUPerDecision, r.RedisInstructionsPerDecision, r.SocketEventsPerDecision, r.Errors)
				if pass == 0 {
					passes = append(passes, nil)
				}
				passes[i] = append(passes[i], r)
				i++
			}
		}
	}
	for _, rs := range passes {
		rep.Results = append(rep.Results, median(rs))
	}
	for _, t := range targets {
		if t.kind == inProcess || t.keyless || t.batch > 1 {
			continue
		}
		m, err := measureMemory(ctx, e, t)
		if err != nil {
			return fmt.Errorf("memory of %s: %w", t.name, err)
		}
		rep.Memory = append(rep.Memory, m)
	}
	if cfg.http {
		rs, err := runCheckAPI(ctx, cfg, e, addr, cells, stderr)
		if err != nil {
			return fmt.Errorf("check API: %w", err)
		}
		rep.HTTP = rs
	}
	compare(rep.Results)
	return output(cfg, &rep, stdout)
}

// checkLoopback refuses a -redis address that is not on a loopback
// interface: the bench loads only this machine.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-redis %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("-redis %q: must be a loopback address (127.0.0.1:PORT)", addr)
	}
	return nil
}

// median returns the pass with the median decisions/s (the lower middle
// of an even number), all its figures from that one pass.
func median(rs []result) result {
	sorted := append([]result(nil), rs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].PerSecond < sorted[j].PerSecond })
	m := sorted[(len(sorted)-1)/2]
	m.Passes = len(rs)
	return m
}

// render prints a saved -json report as a run would have.
func render(cfg *config, stdout io.Writer) error {
	b, err := os.ReadFile(cfg.render)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", cfg.render, err)
	}
	compare(rep.Results)
	if cfg.beside != "" {
		b, err := os.ReadFile(cfg.beside)
		if err != nil {
			return err
		}
		rep.Beside = new(report)
		if err := json.Unmarshal(b, rep.Beside); err != nil {
			return fmt.Errorf("%s: %w", cfg.beside, err)
		}
		compare(rep.Beside.Results)
	}
	return output(cfg, &rep, stdout)
}

func output(cfg *config, rep *report, stdout io.Writer) error {
	if cfg.svg != "" {
		if err := os.WriteFile(cfg.svg, []byte(chart(rep.Results)), 0o644); err != nil {
			return err
		}
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	_, err := io.WriteString(stdout, markdown(rep))
	return err
}
