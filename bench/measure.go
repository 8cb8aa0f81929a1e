package main

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/localquota"
)

// cell is one combination of load: how many callers, over how many
// subjects, with which limits.
type cell struct {
	callers  int
	subjects int
	mode     mode
}

func (c cell) String() string {
	return fmt.Sprintf("%d callers, %d subjects, mostly %s", c.callers, c.subjects, c.mode)
}

// result is one target's figures in one cell.
type result struct {
	Limiter  string `json:"limiter"`
	Kind     kind   `json:"kind"`
	Peer     bool   `json:"peer"`
	Callers  int    `json:"callers"`
	Subjects int    `json:"subjects"`
	Mode     mode   `json:"mode"`
	Passes   int    `json:"passes,omitempty"` // of which this is the median

	Seconds    float64 `json:"seconds"`
	Decisions  int64   `json:"decisions"`
	Allowed    int64   `json:"allowed"`
	Denied     int64   `json:"denied"`
	Errors     int64   `json:"errors"` // decisions not taken: the call failed
	FirstError string  `json:"first_error,omitempty"`
	PerSecond  float64 `json:"decisions_per_second"`
	// Latencies are per call: one decision, or one pipeline of 16 for a
	// pipelined floor.
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p999_us"`

	AllocsPerDecision    float64 `json:"client_allocs_per_decision"`
	ClientCPUPerDecision float64 `json:"client_cpu_us_per_decision"`
	RedisCPUPerDecision  float64 `json:"redis_cpu_us_per_decision,omitempty"`
	// RedisCommandsPerDecision counts every command Redis ran, those a
	// script ran inside included (INFO total_commands_processed).
	RedisCommandsPerDecision float64 `json:"redis_commands_per_decision,omitempty"`
	// ScriptCallsPerDecision counts EVAL, EVALSHA, FCALL and their _RO
	// forms (INFO commandstats).
	ScriptCallsPerDecision float64 `json:"script_calls_per_decision,omitempty"`
	// RoundTripsPerDecision counts the client's calls to Redis; a
	// pipeline counts once.
	RoundTripsPerDecision float64 `json:"round_trips_per_decision,omitempty"`
	// RedisInstructionsPerDecision is what callgrind counted in
	// redis-server, user space, over the measured phase (-callgrind-pid
	// runs only).
	RedisInstructionsPerDecision float64 `json:"redis_instructions_per_decision,omitempty"`
	// SocketEventsPerDecision is INFO stats total_reads_processed +
	// total_writes_processed: the kernel's share that instructions leave
	// out, one read or write of a client socket each.
	SocketEventsPerDecision float64 `json:"socket_events_per_decision,omitempty"`
	// ServerCPUPerDecision is the sluice serve process's CPU (check API
	// rows only).
	ServerCPUPerDecision float64 `json:"server_cpu_us_per_decision,omitempty"`

	// LocalQuota is the row's the Limiter's local-quota counts (sluice.Options.OnLocalQuota) over the whole cell
	// (every subject touched, the warm-up, the measured phase): local
	// quota rows only.
	LocalQuota *localquota.Stats `json:"local_quota,omitempty"`

	// Ratios to the best peer of the same kind in the same cell.
	PerSecondVsBestPeer float64 `json:"decisions_per_second_vs_best_peer,omitempty"`
	RedisCPUVsBestPeer  float64 `json:"redis_cpu_vs_best_peer,omitempty"`
}

// The latency histogram: exact below 64 ns, then 32 buckets per power of
// two (about 3 % wide) up to 2^40 ns.
const histBuckets = 64 + 35*32

type hist [histBuckets]uint64

func bucketOf(ns int64) int {
	if ns < 64 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 6 // ns in [2^(e+5), 2^(e+6))
	i := 64 + (e-1)*32 + int(ns>>e) - 32
	return min(i, histBuckets-1)
}

// bucketMid returns the middle of bucket i, in ns.
func bucketMid(i int) float64 {
	if i < 64 {
		return float64(i)
	}
	e := (i-64)/32 + 1
	m := int64((i-64)%32 + 32)
	return float64(m<<e) + float64(int64(1)<<e)/2
}

func (h *hist) add(d time.Duration) { h[bucketOf(int64(d))]++ }

func (h *hist) merge(o *hist) {
	for i, n := range o {
		h[i] += n
	}
}

// quantile returns the q-quantile in µs.
func (h *hist) quantile(q float64) float64 {
	var total uint64
	for _, n := range h {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total-1)) + 1
	var seen uint64
	for i, n := range h {
		if seen += n; seen >= rank {
			return bucketMid(i) / 1e3
		}
	}
	return 0
}

// loadStats is what one bounded load run observed.
type loadStats struct {
	elapsed                  time.Duration
	calls                    int64
	allowed, denied, errored int64
	firstErr                 error
	hist                     hist
}

type callerStats struct {
	calls, allowed, denied, errored int64
	firstErr                        error
	hist                            hist
}

// load runs callers goroutines that call d as fast as it answers, each on
// subjects picked at random, until dur has passed or ctx is done.
// With limit > 0 it also ends once limit decisions were taken.
func load(ctx context.Context, d decideFunc, batch, callers, subjects int, dur time.Duration, limit int64) *loadStats {
	var stop atomic.Bool
	var taken atomic.Int64
	timer := time.AfterFunc(dur, func() { stop.Store(true) })
	defer timer.Stop()
	unhook := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer unhook()
	parts := make([]callerStats, callers)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &parts[c]
			rng := uint64(c+1) * 0x9E3779B97F4A7C15
			for !stop.Load() {
				subj := 0
				if subjects > 1 {
					subj = nextSubject(&rng, subjects)
				}
				t0 := time.Now()
				a, err := d(ctx, subj)
				p.hist.add(time.Since(t0))
				p.calls++
				if limit > 0 && taken.Add(int64(batch)) >= limit {
					stop.Store(true)
				}
				if err != nil {
					p.errored += int64(batch)
					if p.firstErr == nil {
						p.firstErr = err
					}
					continue
				}
				p.allowed += int64(a)
				p.denied += int64(batch - a)
			}
		}()
	}
	wg.Wait()
	s := &loadStats{elapsed: time.Since(start)}
	for i := range parts {
		p := &parts[i]
		s.calls += p.calls
		s.allowed += p.allowed
		s.denied += p.denied
		s.errored += p.errored
		if s.firstErr == nil {
			s.firstErr = p.firstErr
		}
		s.hist.merge(&p.hist)
	}
	return s
}

// touch takes one decision for every subject (batch subjects per call),
// from callers goroutines, until done or until dur has passed: so every
// subject has state before the measurement, and in the denied mode has
// spent its one unit.
func touch(ctx context.Context, d decideFunc, batch, callers, subjects int, dur time.Duration) {
	deadline := time.Now().Add(dur)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(callers, subjects) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := int(next.Add(int64(batch))) - batch
				if i >= subjects {
					return
				}
				d(ctx, i)
			}
		}()
	}
	wg.Wait()
}

// snapshot is the counters a cell's figures are deltas of.
type snapshot struct {
	mallocs uint64
	cpuUS   float64
	trips   int64
	redis   redisInfo
}

func takeSnapshot(ctx context.Context, e *env, withRedis bool) (snapshot, error) {
	var s snapshot
	if withRedis {
		var err error
		if s.redis, err = readInfo(ctx, e.admin); err != nil {
			return s, err
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.mallocs = ms.Mallocs
	s.cpuUS = processCPU()
	s.trips = e.trips.n.Load()
	return s, nil
}

// processCPU returns this process's user + system CPU time, µs.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}

// touchBound is how long touching every subject may take beyond the
// cell's duration.
const touchBound = 30 * time.Second

type runOptions struct {
	duration, warmup time.Duration
	decisions        int64 // the measured phase ends after this many too, when > 0
}

// runCell measures t in c: on a flushed server (Redis targets), a fresh
// limiter touches every subject once, warms up, then runs for the
// duration between two snapshots.
func runCell(ctx context.Context, e *env, t target, c cell, o runOptions) (result, error) {
	r := result{Limiter: t.name, Kind: t.kind, Peer: t.peer, Callers: c.callers, Subjects: c.subjects, Mode: c.mode}
	withRedis := t.kind != inProcess
	if withRedis {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return r, fmt.Errorf("FLUSHALL: %w", err)
		}
	}
	ce := *e
	ce.subjects = e.subjects[:c.subjects]
	d, release, err := t.build(ctx, &ce, c.mode)
	if err != nil {
		return r, fmt.Errorf("%s: %w", t.name, err)
	}
	defer release()
	err = measure(ctx, e, &r, d, t.batch, c, o, withRedis, nil)
	if ce.localStats != nil {
		ls := ce.localStats()
		r.LocalQuota = &ls
	}
	return r, err
}

// measure fills r with d's figures in c: every subject touched once, a
// warm-up, then the duration between two snapshots. serverCPU, when not
// nil, reads another process's CPU time in µs.
func measure(ctx context.Context, e *env, r *result, d decideFunc, batch int, c cell, o runOptions, withRedis bool, serverCPU func() float64) error {
	// Bounded, but long enough for 10 000 subjects at a few thousand
	// decisions/s: a denied cell must start with every subject spent.
	touch(ctx, d, batch, c.callers, c.subjects, o.duration+touchBound)
	if o.warmup > 0 {
		load(ctx, d, batch, c.callers, c.subjects, o.warmup, o.decisions)
	}
	runtime.GC()
	before, err := takeSnapshot(ctx, e, withRedis)
	if err != nil {
		return err
	}
	var server0 float64
	if serverCPU != nil {
		server0 = serverCPU()
	}
	cg := e.cg
	if !withRedis {
		cg = nil
	}
	if cg != nil {
		if err := cg.start(); err != nil {
			return err
		}
	}
	s := load(ctx, d, batch, c.callers, c.subjects, o.duration, o.decisions)
	var instructions int64
	if cg != nil {
		if instructions, err = cg.stop(); err != nil {
			return err
		}
	}
	after, err := takeSnapshot(ctx, e, withRedis)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.Seconds = s.elapsed.Seconds()
	r.Allowed, r.Denied, r.Errors = s.allowed, s.denied, s.errored
	r.Decisions = s.allowed + s.denied
	if s.firstErr != nil {
		r.FirstError = s.firstErr.Error()
	}
	r.PerSecond = float64(r.Decisions) / r.Seconds
	r.P50US, r.P99US, r.P999US = s.hist.quantile(0.50), s.hist.quantile(0.99), s.hist.quantile(0.999)
	n := float64(max(r.Decisions, 1))
	r.AllocsPerDecision = float64(after.mallocs-before.mallocs) / n
	r.ClientCPUPerDecision = (after.cpuUS - before.cpuUS) / n
	if serverCPU != nil {
		r.ServerCPUPerDecision = (serverCPU() - server0) / n
	}
	if withRedis {
		r.RedisCPUPerDecision = (after.redis.cpuUS - before.redis.cpuUS) / n
		// The first INFO is itself counted by the second.
		r.RedisCommandsPerDecision = float64(after.redis.commands-before.redis.commands-1) / n
		var scripts int64
		for _, name := range scriptCommands {
			scripts += after.redis.calls[name] - before.redis.calls[name]
		}
		r.ScriptCallsPerDecision = float64(scripts) / n
		r.RoundTripsPerDecision = float64(after.trips-before.trips) / n
		// The first INFO's reply and the second's request are counted too.
		r.SocketEventsPerDecision = float64(after.redis.reads+after.redis.writes-before.redis.reads-before.redis.writes-2) / n
		r.RedisInstructionsPerDecision = float64(instructions) / n
	}
	return nil
}

// memoryResult is the Redis memory one subject's state takes.
type memoryResult struct {
	Limiter string   `json:"limiter"`
	Bytes   int64    `json:"bytes"`
	Keys    []string `json:"keys"`
}

// measureMemory runs one allowed decision for one subject on a flushed
// server and sums MEMORY USAGE over every key then present.
func measureMemory(ctx context.Context, e *env, t target) (memoryResult, error) {
	m := memoryResult{Limiter: t.name}
	if err := e.admin.FlushAll(ctx).Err(); err != nil {
		return m, fmt.Errorf("FLUSHALL: %w", err)
	}
	d, release, err := t.build(ctx, e, allowedMode)
	if err != nil {
		return m, err
	}
	defer release()
	if _, err := d(ctx, 0); err != nil {
		return m, fmt.Errorf("%s: one decision: %w", t.name, err)
	}
	m.Bytes, m.Keys, err = memoryPerSubject(ctx, e.admin)
	return m, err
}

// nextSubject advances rng, a xorshift64 state, and returns the subject
// (0 to subjects-1) it picks.
func nextSubject(rng *uint64, subjects int) int {
	*rng ^= *rng << 13
	*rng ^= *rng >> 7
	*rng ^= *rng << 17
	return int(*rng % uint64(subjects))
}
