package main

// The hot-subject cells (-hot): one subject, -procs processes of -callers
// callers each, on one Redis. The command runs itself again as each of
// those processes (the hidden first argument -hot-child, with the row's
// spec), so that every Limiter is in a process of its own, as in a fleet:
// a sluice Limiter with local quota holds its blocks per process, and no
// process shares a client, a pool or a block with another.
//
// A child builds its row's limiter on a client of its own, says "ready"
// on stdout, and waits for "go START" on stdin: START is the wall-clock
// time (Unix ns) its measured phase begins, the same for every child. In
// the allowed cell its callers run from the start, as fast as they are
// answered (the warm-up), and on through the measured phase; in the
// reached cell they wait for START and are paced. A child counts only the
// calls that began at or after START and ended before START + -duration,
// and prints them as one JSON line. The parent reads Redis's INFO at
// START and again once every child has answered: the store calls, their
// commands and the Redis CPU per decision are deltas of those two.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/localquota"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// hotCell is one of the two hot-subject cells.
type hotCell string

const (
	// hotAllowed: a limit never reached (1 000 000 000 per second,
	// every row), callers as fast as they are answered.
	hotAllowed hotCell = "allowed"
	// hotReached: -hot-limit per -hot-window, offered -hot-offer times
	// that by paced callers, from a flushed store.
	hotReached hotCell = "reached"
)

// childArg is the hidden first argument that makes the command a child
// of a hot cell; the second is its hotSpec as JSON.
const childArg = "-hot-child"

// The allowed cell's limit: never reached in a run, accepted by every
// row. Not 10^9 per hour: sluice's gcra keeps burst × window (µs) below
// 2^53, and at an hour the burst could be 2 501 999 at most, which 4
// processes spend in seconds.
const (
	hotAllowedLimit  = 1_000_000_000
	hotAllowedWindow = time.Second
)

// hotOptions are the -hot flags.
type hotOptions struct {
	cells   []hotCell
	procs   int
	callers int
	limit   int64         // the reached cell's limit per window
	window  time.Duration // the reached cell's window
	offer   float64       // the reached cell's offered load, in limits
}

// hotLimit is the limit a row is built with.
type hotLimit struct {
	Limit  int64         `json:"limit"`
	Window time.Duration `json:"window"`
}

// hotTarget is one row of a hot cell.
type hotTarget struct {
	name      string
	peer      bool
	algorithm sluice.Algorithm
	local     bool // sluice with local quota on
	reached   bool // also a row of the reached cell
	// build makes the row's limiter on client: its decisions on the one
	// subject, its local quota counters (zero for a row without), and
	// how to release it.
	build func(ctx context.Context, client *redis.Client, l hotLimit) (hotDecide, func() localquota.Stats, func(), error)
}

// hotDecide takes one decision on the hot subject: whether it was
// allowed, and whether from a block of local quota (Outcome.Local).
type hotDecide func(ctx context.Context) (allowed, local bool, err error)

// hotSubject is the one subject of the hot cells.
var hotSubject = newSubjects(1)[0]

func hotTargets() []hotTarget {
	return []hotTarget{
		hotSluice(sluice.GCRA, true),
		hotSluice(sluice.GCRA, false),
		hotSluice(sluice.FixedWindow, true),
		hotSluice(sluice.FixedWindow, false),
		hotRedisRate(),
		hotUlule(),
	}
}

func noLocal() localquota.Stats { return localquota.Stats{} }

// hotSluice is Limiter.Check over redisstore (default options), the
// fixed window aligned to the clock, with or without local quota (its
// defaults: block time min(100ms, window/10), for gcra at most the time to
// refill an eighth of the burst; at most a tenth of max_cost per block).
func hotSluice(alg sluice.Algorithm, local bool) hotTarget {
	name := "sluice " + alg.String() + " (redisstore)"
	if local {
		name += ", local quota"
	}
	return hotTarget{
		name: name, algorithm: alg, local: local, reached: true,
		build: func(ctx context.Context, client *redis.Client, l hotLimit) (hotDecide, func() localquota.Stats, func(), error) {
			rs, err := redisstore.New(client, redisstore.Options{})
			if err != nil {
				return nil, nil, nil, err
			}
			p := sluice.Policy{ID: "hot", Algorithm: alg, Limit: l.Limit, Window: l.Window,
				ClockAligned: alg == sluice.FixedWindow, LocalQuota: sluice.LocalQuota{Enabled: local}}
			tally := new(localquota.Tally)
			lim, err := sluice.New(rs, []sluice.Policy{p}, sluice.Options{OnLocalQuota: tally.Add})
			if err != nil {
				rs.Close()
				return nil, nil, nil, err
			}
			decide := func(ctx context.Context) (bool, bool, error) {
				o := lim.Check(ctx, sluice.Request{Policy: "hot", Subject: hotSubject})
				switch o.Kind {
				case sluice.Allowed:
					return true, o.Local, nil
				case sluice.Denied:
					return false, false, nil
				}
				return false, false, fmt.Errorf("%v: %w", o.Kind, o.Err)
			}
			return decide, func() localquota.Stats { return tally.Stats("hot") }, func() { rs.Close() }, nil
		},
	}
}

// hotRedisRate is go-redis/redis_rate v10 (GCRA in one EVALSHA), burst =
// rate.
func hotRedisRate() hotTarget {
	return hotTarget{
		name: "go-redis/redis_rate v10 (gcra)", peer: true, algorithm: sluice.GCRA,
		build: func(ctx context.Context, client *redis.Client, l hotLimit) (hotDecide, func() localquota.Stats, func(), error) {
			lim := redis_rate.NewLimiter(client)
			rl := redis_rate.Limit{Rate: int(l.Limit), Burst: int(l.Limit), Period: l.Window}
			return func(ctx context.Context) (bool, bool, error) {
				res, err := lim.Allow(ctx, hotSubject, rl)
				if err != nil {
					return false, false, err
				}
				return res.Allowed > 0, false, nil
			}, noLocal, func() {}, nil
		},
	}
}

// hotUlule is ulule/limiter v3 with its go-redis store (a fixed window in
// one EVALSHA).
func hotUlule() hotTarget {
	return hotTarget{
		name: "ulule/limiter v3 (fixed_window)", peer: true, algorithm: sluice.FixedWindow,
		build: func(ctx context.Context, client *redis.Client, l hotLimit) (hotDecide, func() localquota.Stats, func(), error) {
			st, err := ululeredis.NewStoreWithOptions(client, ulule.StoreOptions{Prefix: "limiter"})
			if err != nil {
				return nil, nil, nil, err
			}
			lim := ulule.New(st, ulule.Rate{Period: l.Window, Limit: l.Limit})
			return func(ctx context.Context) (bool, bool, error) {
				c, err := lim.Get(ctx, hotSubject)
				if err != nil {
					return false, false, err
				}
				return !c.Reached, false, nil
			}, noLocal, func() {}, nil
		},
	}
}

// hotSpec is what a child is told: its row, cell and share of the load.
type hotSpec struct {
	Target   string        `json:"target"`
	Cell     hotCell       `json:"cell"`
	Addr     string        `json:"addr"`
	Pool     int           `json:"pool"`
	Callers  int           `json:"callers"`
	Proc     int           `json:"proc"`
	Procs    int           `json:"procs"`
	Limit    hotLimit      `json:"limit"`
	Offered  float64       `json:"offered"` // decisions/s all children offer together (reached cell)
	Duration time.Duration `json:"duration"`
}

// childResult is what a child measured in its measured phase.
type childResult struct {
	Allowed    int64            `json:"allowed"`
	Denied     int64            `json:"denied"`
	Errors     int64            `json:"errors"`
	FirstError string           `json:"first_error,omitempty"`
	LocalAdmit int64            `json:"local_admitted"` // allowed from a block (Outcome.Local)
	Hist       map[int]uint64   `json:"hist"`           // latency histogram bucket → calls
	CPUUS      float64          `json:"cpu_us"`
	Sent       map[string]int64 `json:"sent"` // commands the client sent, by name
	Local      localquota.Stats `json:"local"`
}

// cmdCounter counts, by name, the commands a client sends while now is
// in [start, end) (Unix ns; start 0: not yet).
type cmdCounter struct {
	start, end atomic.Int64
	names      sync.Map // name → *atomic.Int64
}

func (c *cmdCounter) count(cmd redis.Cmder) {
	s := c.start.Load()
	if s == 0 {
		return
	}
	if now := time.Now().UnixNano(); now < s || now >= c.end.Load() {
		return
	}
	name := cmd.Name()
	v, ok := c.names.Load(name)
	if !ok {
		v, _ = c.names.LoadOrStore(name, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *cmdCounter) snapshot() map[string]int64 {
	m := map[string]int64{}
	c.names.Range(func(k, v any) bool {
		m[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return m
}

// maxWarmup bounds how long a child waits for "go" while warming up.
const maxWarmup = 2 * time.Minute

// runHotChild is the command as a child of a hot cell: spec is its
// hotSpec as JSON; stdin carries the go line, stdout the ready line and
// the result.
func runHotChild(ctx context.Context, spec string, stdin io.Reader, stdout io.Writer) error {
	var s hotSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return fmt.Errorf("%s: %w", childArg, err)
	}
	var t *hotTarget
	for _, ht := range hotTargets() {
		if ht.name == s.Target {
			t = &ht
			break
		}
	}
	if t == nil {
		return fmt.Errorf("%s: no hot row %q", childArg, s.Target)
	}
	ctx, cancel := context.WithTimeout(ctx, maxWarmup+s.Duration+time.Minute)
	defer cancel()
	cc := &cmdCounter{}
	client := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: s.Pool})
	defer client.Close()
	client.AddHook(cc)
	decide, localStats, release, err := t.build(ctx, client, s.Limit)
	if err != nil {
		return err
	}
	defer release()

	parts := make([]childPart, s.Callers)
	var wg sync.WaitGroup
	goCh := make(chan struct{}) // closed when the go line is in
	for c := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.Cell == hotAllowed {
				parts[c].flat(ctx, decide, cc, goCh)
			} else {
				parts[c].paced(ctx, decide, cc, goCh, s, c)
			}
		}()
	}
	if s.Cell == hotReached {
		// Open the pool's connections now, not in the measured phase.
		var pw sync.WaitGroup
		for range s.Callers {
			pw.Go(func() { client.Ping(ctx) })
		}
		pw.Wait()
	}
	start, err := awaitGo(ctx, stdin, stdout)
	if err != nil {
		cancel()
		wg.Wait()
		return err
	}
	cc.end.Store(start + int64(s.Duration))
	cc.start.Store(start)
	close(goCh)
	time.Sleep(time.Until(time.Unix(0, start)))
	cpu0, local0 := processCPU(), localStats()
	wg.Wait()
	cpu1, local1 := processCPU(), localStats()
	r := childResult{Hist: map[int]uint64{}, CPUUS: cpu1 - cpu0, Sent: cc.snapshot(),
		Local: localquota.Stats{Local: local1.Local - local0.Local, Blocks: local1.Blocks - local0.Blocks,
			Units: local1.Units - local0.Units, Unused: local1.Unused - local0.Unused}}
	r.sum(parts)
	return json.NewEncoder(stdout).Encode(r)
}

// sum adds the callers' counts and latencies to r.
func (r *childResult) sum(parts []childPart) {
	var h hist
	for i := range parts {
		p := &parts[i]
		r.Allowed += p.allowed
		r.Denied += p.denied
		r.Errors += p.errored
		r.LocalAdmit += p.local
		if r.FirstError == "" && p.firstErr != nil {
			r.FirstError = p.firstErr.Error()
		}
		h.merge(&p.hist)
	}
	for i, n := range h {
		if n > 0 {
			r.Hist[i] = n
		}
	}
}

// awaitGo says ready on stdout and returns the START of the go line.
func awaitGo(ctx context.Context, stdin io.Reader, stdout io.Writer) (int64, error) {
	if _, err := io.WriteString(stdout, "ready\n"); err != nil {
		return 0, err
	}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdin).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		f, ok := strings.CutPrefix(strings.TrimSpace(l), "go ")
		start, err := strconv.ParseInt(f, 10, 64)
		if !ok || err != nil {
			return 0, fmt.Errorf("%s: want a line \"go START\" on stdin, got %q", childArg, l)
		}
		return start, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(maxWarmup):
		return 0, fmt.Errorf("%s: no go line within %v", childArg, maxWarmup)
	}
}

// childPart is one caller's counts.
type childPart struct {
	allowed, denied, errored, local int64
	firstErr                        error
	hist                            hist
}

// record counts one call that began at t0 and ended at t1 if both are in
// the measured phase, and reports whether the phase is over.
func (p *childPart) record(cc *cmdCounter, t0, t1 time.Time, allowed, local bool, err error) bool {
	s, e := cc.start.Load(), cc.end.Load()
	if s == 0 || t0.UnixNano() < s {
		return false
	}
	if t1.UnixNano() >= e {
		return true
	}
	p.hist.add(t1.Sub(t0))
	switch {
	case err != nil:
		p.errored++
		if p.firstErr == nil {
			p.firstErr = err
		}
	case allowed:
		p.allowed++
		if local {
			p.local++
		}
	default:
		p.denied++
	}
	return false
}

// flat calls decide as fast as it answers, from now (the warm-up) to the
// end of the measured phase.
func (p *childPart) flat(ctx context.Context, decide hotDecide, cc *cmdCounter, goCh chan struct{}) {
	for ctx.Err() == nil {
		t0 := time.Now()
		if s := cc.start.Load(); s != 0 && t0.UnixNano() >= cc.end.Load() {
			return
		}
		ok, local, err := decide(ctx)
		if p.record(cc, t0, time.Now(), ok, local, err) {
			return
		}
	}
}

// paced waits for the go line, then calls decide at this caller's share
// of the offered rate, its first call staggered among all callers of
// all children; late calls are made at once, none is skipped.
func (p *childPart) paced(ctx context.Context, decide hotDecide, cc *cmdCounter, goCh chan struct{}, s hotSpec, c int) {
	select {
	case <-goCh:
	case <-ctx.Done():
		return
	}
	all := s.Procs * s.Callers
	interval := time.Duration(float64(time.Second) * float64(all) / s.Offered)
	start, end := time.Unix(0, cc.start.Load()), time.Unix(0, cc.end.Load())
	next := start.Add(interval * time.Duration(s.Proc*s.Callers+c) / time.Duration(all))
	for next.Before(end) && ctx.Err() == nil {
		time.Sleep(time.Until(next))
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		ok, local, err := decide(ctx)
		if p.record(cc, t0, time.Now(), ok, local, err) {
			return
		}
		next = next.Add(interval)
	}
}
