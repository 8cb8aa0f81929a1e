package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/localquota"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// hotReport is what -hot measured.
type hotReport struct {
	Procs   int         `json:"procs"`
	Callers int         `json:"callers_per_proc"`
	Load    []string    `json:"load"` // /proc/loadavg before and after the run
	Results []hotResult `json:"results"`
}

// hotResult is one row of a hot cell, summed over its processes.
type hotResult struct {
	Cell       hotCell  `json:"cell"`
	Limiter    string   `json:"limiter"`
	Peer       bool     `json:"peer"`
	LocalQuota bool     `json:"local_quota"`
	Algorithm  string   `json:"algorithm"`
	Procs      int      `json:"procs"`
	Callers    int      `json:"callers_per_proc"`
	Limit      hotLimit `json:"limit"`
	Offered    float64  `json:"offered_per_second,omitempty"`

	Seconds    float64 `json:"seconds"`
	Decisions  int64   `json:"decisions"`
	Allowed    int64   `json:"allowed"`
	Denied     int64   `json:"denied"`
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	PerSecond  float64 `json:"decisions_per_second"`
	P50US      float64 `json:"p50_us"`
	P99US      float64 `json:"p99_us"`
	P999US     float64 `json:"p999_us"`

	// StoreCalls is Redis's count (INFO commandstats delta) of the script
	// calls (FCALL, EVALSHA, …) the row's clients sent in the measured
	// phase, plus what they sent of any other command (see fillHot).
	StoreCalls            int64   `json:"store_calls"`
	StoreCallsPerDecision float64 `json:"store_calls_per_decision"`
	// RedisCommands is every commandstats delta but the bench's own INFO,
	// those a script ran inside included; ClientCommands is what the
	// clients' hooks counted sending.
	RedisCommands        map[string]int64 `json:"redis_commands"`
	ClientCommands       map[string]int64 `json:"client_commands"`
	RedisCPUPerDecision  float64          `json:"redis_cpu_us_per_decision"`
	ClientCPUPerDecision float64          `json:"client_cpu_us_per_decision"`
	// LocalAdmitted is the decisions allowed from a block of local quota
	// (Outcome.Local). Local sums the children's the Limiter's local-quota counts (sluice.Options.OnLocalQuota) deltas,
	// read as the measured phase starts and ends (a child's reading may
	// come a few ms late on a busy machine: the blocks are the figure).
	LocalAdmitted int64            `json:"local_admitted"`
	Local         localquota.Stats `json:"local_stats"`

	// The reached cell: the most the algorithm admits over the run (gcra:
	// burst + rate × seconds; fixed_window: limit × clock windows the run
	// touches) and the share of it admitted.
	Bound             float64 `json:"bound,omitempty"`
	AdmittedOverBound float64 `json:"admitted_over_bound,omitempty"`

	PerSecondVsRedisRate float64 `json:"decisions_per_second_vs_redis_rate,omitempty"`
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// runHot measures the -hot cells: every row on a flushed server, its
// processes started afresh.
func runHot(ctx context.Context, cfg *config, addr string, admin *redis.Client, stderr io.Writer) (*hotReport, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	o := cfg.hot
	// The children write their stderr to it, each through a goroutine of
	// its own unless it is a file.
	stderr = &lockedWriter{w: stderr}
	rep := &hotReport{Procs: o.procs, Callers: o.callers, Load: []string{loadAvg()}}
	for _, c := range o.cells {
		for _, t := range hotTargets() {
			if !cfg.only.MatchString(t.name) || (c == hotReached && !t.reached) {
				continue
			}
			r, err := runHotRow(ctx, cfg, exe, addr, admin, t, c, stderr)
			if err != nil {
				return nil, fmt.Errorf("hot %s, %s: %w", c, t.name, err)
			}
			fmt.Fprintf(stderr, "[hot %s] %-45s %10.0f decisions/s  %.4f store calls/dec  allowed %d denied %d errors %d  p99 %.0f µs",
				c, t.name, r.PerSecond, r.StoreCallsPerDecision, r.Allowed, r.Denied, r.Errors, r.P99US)
			if r.Bound > 0 {
				fmt.Fprintf(stderr, "  admitted/bound %.3f", r.AdmittedOverBound)
			}
			fmt.Fprintln(stderr)
			rep.Results = append(rep.Results, r)
		}
	}
	rep.Load = append(rep.Load, loadAvg())
	compareHot(rep.Results)
	return rep, nil
}

// compareHot sets each allowed-cell row's decisions/s over redis_rate's.
func compareHot(rs []hotResult) {
	var ref float64
	for _, r := range rs {
		if r.Cell == hotAllowed && r.Limiter == hotRedisRate().name {
			ref = r.PerSecond
		}
	}
	for i := range rs {
		if rs[i].Cell == hotAllowed && ref > 0 {
			rs[i].PerSecondVsRedisRate = rs[i].PerSecond / ref
		}
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// hotChild is one started child process.
type hotChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, line by line; closed at EOF
}

func startChild(ctx context.Context, exe string, s hotSpec, stderr io.Writer) (*hotChild, error) {
	spec, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, childArg, string(spec))
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := &hotChild{cmd: cmd, stdin: stdin, lines: make(chan string, 2)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<24)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		close(ch.lines)
	}()
	return ch, nil
}

// line returns the child's next stdout line, waiting at most d.
func (c *hotChild) line(d time.Duration) (string, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("child pid %d ended without an answer", c.cmd.Process.Pid)
		}
		return l, nil
	case <-time.After(d):
		return "", fmt.Errorf("child pid %d did not answer within %v", c.cmd.Process.Pid, d)
	}
}

// stop ends the child: its stdin closed, then killed by its PID if it
// has not exited within 5 s.
func (c *hotChild) stop() {
	c.stdin.Close()
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// runHotRow measures row t in cell c.
func runHotRow(ctx context.Context, cfg *config, exe, addr string, admin *redis.Client, t hotTarget, c hotCell, stderr io.Writer) (hotResult, error) {
	o := cfg.hot
	l := hotLimit{Limit: hotAllowedLimit, Window: hotAllowedWindow}
	var offered float64
	if c == hotReached {
		l = hotLimit{Limit: o.limit, Window: o.window}
		offered = o.offer * float64(o.limit) / o.window.Seconds()
	}
	r := hotResult{Cell: c, Limiter: t.name, Peer: t.peer, LocalQuota: t.local, Algorithm: t.algorithm.String(),
		Procs: o.procs, Callers: o.callers, Limit: l, Offered: offered}
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return r, fmt.Errorf("FLUSHALL: %w", err)
	}
	var children []*hotChild
	defer func() {
		for _, ch := range children {
			ch.stop()
		}
	}()
	for p := range o.procs {
		ch, err := startChild(ctx, exe, hotSpec{Target: t.name, Cell: c, Addr: addr, Pool: cfg.pool, Callers: o.callers,
			Proc: p, Procs: o.procs, Limit: l, Offered: offered, Duration: cfg.run.duration}, stderr)
		if err != nil {
			return r, err
		}
		children = append(children, ch)
	}
	for _, ch := range children {
		if l, err := ch.line(time.Minute); err != nil || l != "ready" {
			return r, fmt.Errorf("waiting for ready: %q %v", l, err)
		}
	}
	start := time.Now().Add(cfg.run.warmup + 100*time.Millisecond)
	if c == hotReached {
		// A fresh store, no warm-up, the run's first instant a window's.
		start = time.Now().Add(200 * time.Millisecond).Truncate(o.window).Add(o.window)
	}
	for _, ch := range children {
		if _, err := fmt.Fprintf(ch.stdin, "go %d\n", start.UnixNano()); err != nil {
			return r, err
		}
	}
	time.Sleep(time.Until(start))
	before, err := readInfo(ctx, admin)
	if err != nil {
		return r, err
	}
	var h hist
	var cpu float64
	r.ClientCommands = map[string]int64{}
	for _, ch := range children {
		line, err := ch.line(cfg.run.duration + time.Minute)
		if err != nil {
			return r, err
		}
		var cr childResult
		if err := json.Unmarshal([]byte(line), &cr); err != nil {
			return r, fmt.Errorf("child's result %q: %w", line, err)
		}
		r.add(&cr, &h)
		cpu += cr.CPUUS
	}
	for _, ch := range children {
		ch.stop()
	}
	children = nil
	after, err := readInfo(ctx, admin)
	if err != nil {
		return r, err
	}
	fillHot(&r, &h, cpu, before, after, start, cfg.run.duration)
	return r, nil
}

// add sums one child's counts into r, its latencies into h.
func (r *hotResult) add(cr *childResult, h *hist) {
	r.Allowed += cr.Allowed
	r.Denied += cr.Denied
	r.Errors += cr.Errors
	r.LocalAdmitted += cr.LocalAdmit
	if r.FirstError == "" {
		r.FirstError = cr.FirstError
	}
	for i, n := range cr.Hist {
		if i >= 0 && i < histBuckets {
			h[i] += n
		}
	}
	for name, n := range cr.Sent {
		r.ClientCommands[name] += n
	}
	r.Local.Local += cr.Local.Local
	r.Local.Blocks += cr.Local.Blocks
	r.Local.Units += cr.Local.Units
	r.Local.Unused += cr.Local.Unused
}

// fillHot computes r's figures from what its children and Redis counted
// over the measured phase [start, start+d).
func fillHot(r *hotResult, h *hist, cpu float64, before, after redisInfo, start time.Time, d time.Duration) {
	r.Seconds = d.Seconds()
	r.Decisions = r.Allowed + r.Denied
	r.PerSecond = float64(r.Decisions) / r.Seconds
	r.P50US, r.P99US, r.P999US = h.quantile(0.50), h.quantile(0.99), h.quantile(0.999)
	n := float64(max(r.Decisions, 1))
	r.ClientCPUPerDecision = cpu / n
	r.RedisCPUPerDecision = (after.cpuUS - before.cpuUS) / n
	// commandstats names a subcommand "client|setinfo"; a client names it
	// "client".
	r.RedisCommands = map[string]int64{}
	for name, v := range after.calls {
		if dv := v - before.calls[name]; dv > 0 {
			base, _, _ := strings.Cut(name, "|")
			r.RedisCommands[base] += dv
		}
	}
	r.RedisCommands["info"]-- // the first INFO is counted by the second
	if r.RedisCommands["info"] <= 0 {
		delete(r.RedisCommands, "info")
	}
	// A command a script runs inside shows in commandstats under its own
	// name (the GET in an FCALL), so Redis's count of a GET the client
	// sends too (a Limiter's read of its overrides) holds both: for those
	// the client's count is taken, never more than Redis's.
	for name, sent := range r.ClientCommands {
		if slices.Contains(scriptCommands, name) {
			r.StoreCalls += r.RedisCommands[name]
		} else {
			r.StoreCalls += min(sent, r.RedisCommands[name])
		}
	}
	r.StoreCallsPerDecision = float64(r.StoreCalls) / n
	if r.Cell != hotReached {
		return
	}
	switch r.Algorithm {
	case sluice.GCRA.String():
		r.Bound = float64(r.Limit.Limit) + float64(r.Limit.Limit)*d.Seconds()/r.Limit.Window.Seconds()
	case sluice.FixedWindow.String():
		w := int64(r.Limit.Window)
		first, last := start.UnixNano()/w, (start.UnixNano()+int64(d)-1)/w
		r.Bound = float64(r.Limit.Limit * (last - first + 1))
	}
	if r.Bound > 0 {
		r.AdmittedOverBound = float64(r.Allowed) / r.Bound
	}
}

// hotMarkdown renders a hot report: one table per cell, then the targets.
func hotMarkdown(b *strings.Builder, rep *report) {
	hr := rep.Hot
	fmt.Fprintf(b, "One subject, %d processes × %d callers, each process its own Limiter (or peer) and go-redis client (pool %d), one redis-server. Machine load (/proc/loadavg) before the run: `%s`; after: `%s`.\n\n",
		hr.Procs, hr.Callers, rep.Machine.Pool, hr.Load[0], hr.Load[len(hr.Load)-1])
	var allowed, reached []hotResult
	for _, r := range hr.Results {
		if r.Cell == hotAllowed {
			allowed = append(allowed, r)
		} else {
			reached = append(reached, r)
		}
	}
	if len(allowed) > 0 {
		fmt.Fprintf(b, "#### A limit never reached (%s per %v, every row), callers as fast as they are answered\n\n", num(hotAllowedLimit), hotAllowedWindow)
		b.WriteString("| limiter | decisions/s | × redis_rate | store calls/dec | Redis CPU µs/dec | p50 µs | p99 µs | denied | errors | local / blocks |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, r := range allowed {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", hotName(&r), num(r.PerSecond), ratio(r.PerSecondVsRedisRate),
				calls(r.StoreCallsPerDecision), f2(r.RedisCPUPerDecision), f1(r.P50US), f1(r.P99US), num(float64(r.Denied)), num(float64(r.Errors)), localCol(&r))
		}
		b.WriteString("\n")
	}
	if len(reached) > 0 {
		r0 := reached[0]
		fmt.Fprintf(b, "#### The limit reached: %s per %v, offered %s/s by paced callers from a flushed store\n\n", num(float64(r0.Limit.Limit)), r0.Limit.Window, num(r0.Offered))
		b.WriteString("Bound: gcra, burst + rate × run; fixed_window (aligned to the clock), the limit × the clock windows the run touches.\n\n")
		b.WriteString("| limiter | admitted | bound | admitted ÷ bound | decisions/s | store calls/dec | Redis CPU µs/dec | p50 µs | p99 µs | errors | local / blocks |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, r := range reached {
			fmt.Fprintf(b, "| %s | %s | %s | %.3f | %s | %s | %s | %s | %s | %s | %s |\n", hotName(&r), num(float64(r.Allowed)), num(r.Bound), r.AdmittedOverBound,
				num(r.PerSecond), calls(r.StoreCallsPerDecision), f2(r.RedisCPUPerDecision), f1(r.P50US), f1(r.P99US), num(float64(r.Errors)), localCol(&r))
		}
		b.WriteString("\n")
	}
	var errs []string
	for _, r := range hr.Results {
		if r.FirstError != "" {
			errs = append(errs, fmt.Sprintf("%s (%s): %d errors, the first: `%s`", r.Limiter, r.Cell, r.Errors, r.FirstError))
		}
	}
	if len(errs) > 0 {
		b.WriteString("Errors: " + strings.Join(errs, "; ") + "\n\n")
	}
	hotTargetLines(b, allowed)
}

// hotTargetLines says, for each local quota row of the allowed cell,
// whether it met the two targets.
func hotTargetLines(b *strings.Builder, allowed []hotResult) {
	for _, r := range allowed {
		if !r.LocalQuota || r.PerSecondVsRedisRate == 0 {
			continue
		}
		met := func(ok bool) string {
			if ok {
				return "met"
			}
			return "missed"
		}
		fmt.Fprintf(b, "- %s: decisions/s %.1f× redis_rate's (target ≥ 10×: %s); %s store calls per decision (target ≤ 0.02: %s); denied %d.\n",
			r.Limiter, r.PerSecondVsRedisRate, met(r.PerSecondVsRedisRate >= 10), calls(r.StoreCallsPerDecision), met(r.StoreCallsPerDecision <= 0.02), r.Denied)
	}
	b.WriteString("\n")
}

func hotName(r *hotResult) string {
	if r.Peer {
		return "*" + r.Limiter + "*"
	}
	return r.Limiter
}

// calls formats store calls per decision: enough digits for a small one.
func calls(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 0.00001:
		return fmt.Sprintf("%.1e", v)
	case v < 0.01:
		return fmt.Sprintf("%.5f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func localCol(r *hotResult) string {
	if !r.LocalQuota {
		return "—"
	}
	return fmt.Sprintf("%s / %s", num(float64(r.LocalAdmitted)), num(float64(r.Local.Blocks)))
}

// parseHot reads the -hot flags into c.hot.
func parseHot(c *config, cells string, callersSet bool) error {
	for _, f := range strings.Split(cells, ",") {
		switch hotCell(f) {
		case hotAllowed, hotReached:
			c.hot.cells = append(c.hot.cells, hotCell(f))
		default:
			return fmt.Errorf("-hot %q: must be allowed, reached or both", f)
		}
	}
	c.hot.callers = 16
	if callersSet {
		if len(c.callers) != 1 {
			return errors.New("-hot takes one -callers value: the callers of each process")
		}
		c.hot.callers = c.callers[0]
	}
	switch {
	case c.hot.procs < 1 || c.hot.procs > 64:
		return errors.New("-procs must be between 1 and 64")
	case c.hot.limit < 8 || c.hot.limit > math.MaxInt32:
		return errors.New("-hot-limit must be between 8 (local quota's least max_cost) and 2147483647")
	case c.hot.window < 10*time.Millisecond || c.hot.window > time.Hour || c.hot.window%time.Millisecond != 0:
		return errors.New("-hot-window must be a whole number of milliseconds between 10ms and 1h")
	case c.hot.offer <= 0 || c.hot.offer > 100:
		return errors.New("-hot-offer must be in (0, 100]")
	}
	return nil
}
