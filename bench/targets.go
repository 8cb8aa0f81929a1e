package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/localquota"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	golimiter "github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	throttledredis "github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

// kind says where a target keeps its state.
type kind string

const (
	redisPath kind = "redis"   // a limiter whose state lives in Redis
	inProcess kind = "process" // a limiter whose state lives in this process
	floor     kind = "floor"   // not a limiter: the least a Redis round trip costs
)

// mode is how the limits are set.
type mode string

const (
	allowedMode mode = "allowed" // a limit no caller reaches in a run
	deniedMode  mode = "denied"  // 1 per hour: after its first decision a subject is denied
)

// allowedWindow is the window of the allowed mode (-window). Default: 1s.
var allowedWindow = time.Second

// limits returns the limit and window every limiter gets in m. In the
// allowed mode that is 1 000 000 per second over allowedWindow (the same
// rate over a longer window when -window is longer); sliding_log keeps
// one entry per admitted unit and allows at most 100 000, which no
// subject reaches here either.
func limits(m mode, alg sluice.Algorithm) (int64, time.Duration) {
	if m == deniedMode {
		return 1, time.Hour
	}
	if alg == sluice.SlidingLog {
		return 100_000, allowedWindow
	}
	return int64(1_000_000 * allowedWindow.Seconds()), allowedWindow
}

// env is what every target is built on: one go-redis client shared by all
// callers, as an application holds it, and the subjects.
type env struct {
	client   *redis.Client // pool of -pool connections, shared by all callers
	admin    *redis.Client // FLUSHALL, INFO, SCAN, MEMORY USAGE: never counted
	trips    *tripHook
	subjects []string
	cg       *callgrind // counts the server's instructions; nil unless -callgrind-pid
	// localStats, when a target's build sets it, reads what its
	// Limiter's local quota did (local quota rows).
	localStats func() localquota.Stats
}

// decideFunc takes one call's worth of decisions (batch of them for a
// pipelined floor) for subject index subj and reports how many were
// allowed; an error means none was decided.
type decideFunc func(ctx context.Context, subj int) (allowed int, err error)

// target is one limiter, or one floor, under test.
type target struct {
	name  string
	kind  kind
	peer  bool // another library, not sluice
	batch int  // decisions per call: 16 for pipelined floors, else 1
	// keyless floors write no state: no memory to measure.
	keyless bool
	// allowedOnly rows run in the allowed mode's cells only (local quota
	// needs a max_cost of 8, the denied mode's limit is 1).
	allowedOnly bool
	// build makes a fresh limiter for one cell; the returned func releases
	// it.
	build func(ctx context.Context, e *env, m mode) (decideFunc, func(), error)
}

func (t target) modeless() bool { return t.kind == floor }

// runsIn reports whether t has a row in the cells of mode m, the first
// of the run's modes being first.
func (t target) runsIn(m, first mode) bool {
	return (!t.modeless() || m == first) && (!t.allowedOnly || m == allowedMode)
}

// newSubjects returns n pseudonym-like subjects of 43 bytes, as
// sluice's subject package would hand the store.
func newSubjects(n int) []string {
	s := make([]string, n)
	for i := range s {
		h := sha256.Sum256([]byte(fmt.Sprint("subject-", i)))
		s[i] = "k1." + hex.EncodeToString(h[:20])
	}
	return s
}

var sluiceAlgorithms = []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA}

func allTargets() []target {
	var ts []target
	for _, alg := range sluiceAlgorithms {
		ts = append(ts, sluiceTarget(alg, redisPath))
	}
	ts = append(ts, sluiceLocalTarget(sluice.GCRA), sluiceLocalTarget(sluice.FixedWindow))
	ts = append(ts, sluiceLeaseTarget(redisPath))
	ts = append(ts, redisRateTarget(), ululeTarget(), throttledTarget())
	for _, alg := range sluiceAlgorithms {
		ts = append(ts, sluiceTarget(alg, inProcess))
	}
	ts = append(ts, sluiceLeaseTarget(inProcess))
	ts = append(ts, goLimiterTarget(), xrateTarget())
	ts = append(ts, floorTargets()...)
	ts = append(ts, batchedFloorTargets()...)
	return ts
}

// newStore returns the store of kind k with default options, and how to
// close it: redisstore on the shared client, or memstore.
func newStore(e *env, k kind) (sluice.Store, func(), error) {
	if k == redisPath {
		rs, err := redisstore.New(e.client, redisstore.Options{})
		if err != nil {
			return nil, nil, err
		}
		return rs, func() { rs.Close() }, nil
	}
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		return nil, nil, err
	}
	return ms, func() { ms.Close() }, nil
}

// sluiceLeaseTarget drives a concurrency policy: one decision is an
// acquire (Limiter.Check) and, when allowed and the mode is mostly
// allowed, its release (a Check of Op Release): two store calls. Mostly denied:
// the first acquire of each subject (the warm-up's) holds its one slot
// for the hour, every later one is denied.
func sluiceLeaseTarget(k kind) target {
	store := storeName("redis")
	if k == inProcess {
		store = storeName("memory")
	}
	return target{
		name: "sluice concurrency, acquire+release (" + store + ")", kind: k, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			st, closeStore, err := newStore(e, k)
			if err != nil {
				return nil, nil, err
			}
			limit := int64(100_000)
			if m == deniedMode {
				limit = 1
			}
			lim, err := sluice.New(st, []sluice.Policy{{ID: "bench", Algorithm: sluice.Concurrency, Limit: limit, LeaseTTL: time.Hour}}, sluice.Options{})
			if err != nil {
				closeStore()
				return nil, nil, err
			}
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				o := lim.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "bench", Subject: subjects[i]})
				switch o.Kind {
				case sluice.Allowed:
					if m == deniedMode {
						return 1, nil
					}
					if r := lim.Check(ctx, sluice.Request{Op: sluice.Release, Policies: o.Lease.Policies, Subject: o.Lease.Subject, LeaseID: o.Lease.ID}); r.Kind != sluice.Allowed {
						return 0, fmt.Errorf("release: %v: %w", r.Kind, r.Err)
					}
					return 1, nil
				case sluice.Denied:
					return 0, nil
				}
				return 0, fmt.Errorf("%v: %w", o.Kind, o.Err)
			}, closeStore, nil
		},
	}
}

// sluiceTarget drives sluice.Limiter.Check over redisstore (on the shared
// client, default options) or memstore (default options).
func sluiceTarget(alg sluice.Algorithm, k kind) target {
	store := storeName("redis")
	if k == inProcess {
		store = storeName("memory")
	}
	return target{
		name: "sluice " + alg.String() + " (" + store + ")", kind: k, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			limit, window := limits(m, alg)
			st, closeStore, err := newStore(e, k)
			if err != nil {
				return nil, nil, err
			}
			lim, err := sluice.New(st, []sluice.Policy{{ID: "bench", Algorithm: alg, Limit: limit, Window: window}}, sluice.Options{})
			if err != nil {
				closeStore()
				return nil, nil, err
			}
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				o := lim.Check(ctx, sluice.Request{Policy: "bench", Subject: subjects[i]})
				switch o.Kind {
				case sluice.Allowed:
					return 1, nil
				case sluice.Denied:
					return 0, nil
				}
				return 0, fmt.Errorf("%v: %w", o.Kind, o.Err)
			}, closeStore, nil
		},
	}
}

// sluiceLocalTarget is sluiceTarget on redisstore with local quota on
// (its defaults), in the allowed mode only: over 10 000 subjects no
// subject is asked often enough to take a block, and the row shows what
// local quota costs a subject seen rarely.
func sluiceLocalTarget(alg sluice.Algorithm) target {
	return target{
		name: "sluice " + alg.String() + " (redisstore), local quota", kind: redisPath, batch: 1, allowedOnly: true,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			limit, window := limits(m, alg)
			st, closeStore, err := newStore(e, redisPath)
			if err != nil {
				return nil, nil, err
			}
			p := sluice.Policy{ID: "bench", Algorithm: alg, Limit: limit, Window: window, LocalQuota: sluice.LocalQuota{Enabled: true}}
			tally := new(localquota.Tally)
			lim, err := sluice.New(st, []sluice.Policy{p}, sluice.Options{OnLocalQuota: tally.Add})
			if err != nil {
				closeStore()
				return nil, nil, err
			}
			e.localStats = func() localquota.Stats { return tally.Stats("bench") }
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				o := lim.Check(ctx, sluice.Request{Policy: "bench", Subject: subjects[i]})
				switch o.Kind {
				case sluice.Allowed:
					return 1, nil
				case sluice.Denied:
					return 0, nil
				}
				return 0, fmt.Errorf("%v: %w", o.Kind, o.Err)
			}, closeStore, nil
		},
	}
}

// redisRateTarget is go-redis/redis_rate v10: GCRA in one EVALSHA.
func redisRateTarget() target {
	return target{
		name: "go-redis/redis_rate v10 (gcra)", kind: redisPath, peer: true, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			limit, window := limits(m, sluice.GCRA)
			lim := redis_rate.NewLimiter(e.client)
			l := redis_rate.Limit{Rate: int(limit), Burst: int(limit), Period: window}
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				res, err := lim.Allow(ctx, subjects[i], l)
				if err != nil {
					return 0, err
				}
				return min(res.Allowed, 1), nil
			}, func() {}, nil
		},
	}
}

// ululeTarget is ulule/limiter v3 with its go-redis store: a fixed window
// in one EVALSHA (INCRBY, PEXPIRE on a new key, else PTTL).
func ululeTarget() target {
	return target{
		name: "ulule/limiter v3 (fixed_window)", kind: redisPath, peer: true, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			limit, window := limits(m, sluice.FixedWindow)
			st, err := ululeredis.NewStoreWithOptions(e.client, ulule.StoreOptions{Prefix: "limiter"})
			if err != nil {
				return nil, nil, err
			}
			lim := ulule.New(st, ulule.Rate{Period: window, Limit: limit})
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				c, err := lim.Get(ctx, subjects[i])
				if err != nil {
					return 0, err
				}
				if c.Reached {
					return 0, nil
				}
				return 1, nil
			}, func() {}, nil
		},
	}
}

// throttledTarget is throttled/throttled v2's GCRA over its go-redis v9
// store: a pipelined TIME + GET, then SETNX + EXPIRE for a new key or an
// EVAL (the whole script text, every call) compare-and-swap, retried up
// to 10 times under contention before it gives up with an error.
func throttledTarget() target {
	return target{
		name: "throttled v2 (gcra)", kind: redisPath, peer: true, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			limit, window := limits(m, sluice.GCRA)
			st, err := throttledredis.NewCtx(e.client, "throttled:")
			if err != nil {
				return nil, nil, err
			}
			// MaxBurst is the number of requests beyond the first.
			lim, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerDuration(int(limit), window), MaxBurst: int(limit) - 1})
			if err != nil {
				return nil, nil, err
			}
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				limited, _, err := lim.RateLimitCtx(ctx, subjects[i], 1)
				if err != nil {
					return 0, err
				}
				if limited {
					return 0, nil
				}
				return 1, nil
			}, func() {}, nil
		},
	}
}

// goLimiterTarget is sethvargo/go-limiter's memorystore (a token bucket).
func goLimiterTarget() target {
	return target{
		name: "sethvargo/go-limiter memorystore", kind: inProcess, peer: true, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			limit, window := limits(m, sluice.TokenBucket)
			st, err := golimiter.New(&golimiter.Config{Tokens: uint64(limit), Interval: window})
			if err != nil {
				return nil, nil, err
			}
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				_, _, _, ok, err := st.Take(ctx, subjects[i])
				if err != nil {
					return 0, err
				}
				if ok {
					return 1, nil
				}
				return 0, nil
			}, func() { st.Close(context.Background()) }, nil
		},
	}
}

// xrateTarget is a mutex-guarded map of golang.org/x/time/rate limiters,
// the usual hand-rolled in-process limiter.
func xrateTarget() target {
	return target{
		name: "x/time/rate map + mutex", kind: inProcess, peer: true, batch: 1,
		build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
			limit, window := limits(m, sluice.TokenBucket)
			every := rate.Limit(float64(limit) / window.Seconds())
			var mu sync.Mutex
			lims := make(map[string]*rate.Limiter)
			subjects := e.subjects
			return func(ctx context.Context, i int) (int, error) {
				mu.Lock()
				l, ok := lims[subjects[i]]
				if !ok {
					l = rate.NewLimiter(every, int(limit))
					lims[subjects[i]] = l
				}
				mu.Unlock()
				if l.Allow() {
					return 1, nil
				}
				return 0, nil
			}, func() {}, nil
		},
	}
}

const pipelineDepth = 16

// incrScript is the least a fixed-window counter can do in one script:
// INCR, and PEXPIRE when the counter is new.
const incrScript = `local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n`

// floorTargets are the least a decision can cost through the same client:
// PING, EVALSHA of "return 1", the INCR+PEXPIRE script, one per call and
// pipelined 16 deep.
func floorTargets() []target {
	// op queues one command on c (a pipeline) or runs it (the client).
	type op func(ctx context.Context, c redis.Cmdable, sha, key string) error
	mk := func(name string, script string, depth int, keyless bool, do op) target {
		if depth > 1 {
			name += fmt.Sprintf(" ×%d pipelined", depth)
		}
		return target{
			name: "floor: " + name, kind: floor, batch: depth, keyless: keyless,
			build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
				sha := ""
				if script != "" {
					var err error
					if sha, err = e.client.ScriptLoad(ctx, script).Result(); err != nil {
						return nil, nil, err
					}
				}
				keys := make([]string, len(e.subjects))
				for i, s := range e.subjects {
					keys[i] = "floor:{" + s + "}"
				}
				if depth == 1 {
					return func(ctx context.Context, i int) (int, error) {
						if err := do(ctx, e.client, sha, keys[i]); err != nil {
							return 0, err
						}
						return 1, nil
					}, func() {}, nil
				}
				return func(ctx context.Context, i int) (int, error) {
					pipe := e.client.Pipeline()
					for j := range depth {
						do(ctx, pipe, sha, keys[(i+j)%len(keys)])
					}
					if _, err := pipe.Exec(ctx); err != nil {
						return 0, err
					}
					return depth, nil
				}, func() {}, nil
			},
		}
	}
	ping := func(ctx context.Context, c redis.Cmdable, sha, key string) error { return c.Ping(ctx).Err() }
	ret1 := func(ctx context.Context, c redis.Cmdable, sha, key string) error {
		return c.EvalSha(ctx, sha, nil).Err()
	}
	incr := func(ctx context.Context, c redis.Cmdable, sha, key string) error {
		return c.EvalSha(ctx, sha, []string{key}, 3_600_000).Err()
	}
	var ts []target
	for _, depth := range []int{1, pipelineDepth} {
		ts = append(ts,
			mk("PING", "", depth, true, ping),
			mk("EVALSHA return 1", "return 1", depth, true, ret1),
			mk("INCR+PEXPIRE script", incrScript, depth, false, incr),
		)
	}
	return ts
}

// tripHook counts the client's calls to Redis: a command or a whole
// pipeline counts once.
type tripHook struct{ n atomic.Int64 }

func (h *tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
