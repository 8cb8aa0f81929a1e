// Package wiring turns a configuration (internal/config) into
// running parts, in one place for every command: the store the config
// names (memstore, or redisstore over one Redis, a Cluster or Sentinel,
// dialled as sluice serve dials them), the store of the proxy's local
// fallbacks, a configuration's Limiters, pseudonymizer and Envoy state
// for each generation sluice serve serves (Build), the Limiters and
// stores sluice bench drives, and the fleet of Limiters sluice simulate
// --local-quota runs on a virtual clock. cmd/sluice and internal/server
// call it; neither builds a store or a Limiter itself
// (TestOnePlaceBuildsLimitersAndStores holds that).
package wiring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

// Store is a store built from a config, with what runs around it. Close
// it when done.
type Store struct {
	sluice.Store
	// Type is config.StoreMemory or config.StoreRedis.
	Type string
	// Ready answers whether the store can decide now, for GET /readyz;
	// nil: always.
	Ready func(ctx context.Context) error
	// Evictions counts the subjects' states evicted for room, LostIDs the
	// remembered evaluation ids evicted alive; nil: the store evicts
	// nothing.
	Evictions, LostIDs func() int64
	// Skipped counts the fields of the store's overrides skipped as
	// unreadable (written by another tool or a later sluice); nil: the
	// store reads every one.
	Skipped func() int64
	// Breaker returns the state of the store's circuit breaker: "closed",
	// "open" or "half_open"; nil: no breaker.
	Breaker func() string
	// Client is the Redis client of a redis store, nil otherwise.
	Client redis.UniversalClient
	// MaxKeys is the embedded store's bound (memstore.Options.MaxKeys),
	// 0 for Redis.
	MaxKeys int
	close   func() error
}

// Close releases the store and its connections.
func (s *Store) Close() error { return s.close() }

// StoreOptions are what a store is built with besides its config.
type StoreOptions struct {
	// Clock is the memory store's clock, and the one the breaker's log is
	// throttled on. Default: the real clock.
	Clock sluice.Clock
	// Getenv reads the Redis password's variable. Default: none is set.
	Getenv func(string) string
	// Log, when set, receives go-redis's own log lines, the circuit
	// breaker's changes and the fallback to scripts. Default: none.
	Log *slog.Logger
	// Prefix is put before every Redis key (sluice bench's run keeps its
	// keys apart with one). Default: redisstore's.
	Prefix string
	// MemoryLimit is the process's memory limit in bytes, which the
	// embedded store's bound is derived from when store.memory.max_keys
	// is unset (math.MaxInt64: none). Default: the runtime's
	// (GOMEMLIMIT).
	MemoryLimit int64
}

// MemoryBytesPerKey is what the embedded store's derived bound budgets
// for each (subject, policy) state, its remembered evaluation id
// included: the heap a sluice serve holds per state at the bound under a
// flood of distinct subjects, each request with an id of its own (153 MiB
// in use for 117 760 states and ids, the server's own heap and garbage
// not yet collected included: 1 362 bytes), rounded up
// (docs/configuration.md, "The embedded store's bound").
const MemoryBytesPerKey = 1400

// defaultMaxKeys is memstore's own default bound (memstore.Options).
const defaultMaxKeys = 1_000_000

// memoryMaxKeys is the embedded store's bound: store.memory.max_keys when
// set; else, under a memory limit, as many states as half of it holds at
// MemoryBytesPerKey each (the other half is the server's own and the
// collector's room), within config's range; else memstore's default.
func memoryMaxKeys(m *config.Memory, limit int64) int {
	switch {
	case m != nil && m.MaxKeys > 0:
		return int(m.MaxKeys)
	case limit <= 0 || limit == math.MaxInt64:
		return defaultMaxKeys
	}
	return int(min(max(limit/2/MemoryBytesPerKey, config.MinMaxKeys), config.MaxMaxKeys))
}

// maxOverrides bounds the tenant overrides a store built here holds (the
// admin API's: the config file's are the Limiters' own, on top): every
// server holds them all in memory, and each change rebuilds every
// Limiter's snapshot of them at its next read (5ms at 10 000). The store
// counts them in the write, in O(1), exactly across servers.
const maxOverrides = 10000

// NewStore builds the store sc names. It is the one place where store
// types are wired. It does not contact Redis: sluice serve starts while
// Redis is down or hung, and answers per failure mode until it is back.
func NewStore(sc config.Store, o StoreOptions) (*Store, error) {
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.MemoryLimit == 0 {
		o.MemoryLimit = debug.SetMemoryLimit(-1) // reads it
	}
	switch sc.Type {
	case config.StoreMemory, "":
		maxKeys := memoryMaxKeys(sc.Memory, o.MemoryLimit)
		ms, err := memstore.New(memstore.Options{Clock: o.Clock, MaxKeys: maxKeys, MaxOverrides: maxOverrides})
		if err != nil {
			return nil, fmt.Errorf("store type memory: %w", err)
		}
		return &Store{Store: ms, Type: config.StoreMemory, MaxKeys: maxKeys, close: ms.Close, Evictions: func() int64 { n, _ := ms.Evictions(); return n }, LostIDs: func() int64 { _, n := ms.Evictions(); return n }}, nil
	case config.StoreRedis:
		return newRedisStore(sc.Redis, o)
	}
	return nil, fmt.Errorf("store type %q: unknown", sc.Type)
}

// breakerLogEvery is the least time between two log lines of the Redis
// circuit breaker's state: a breaker that flaps (a read-only replica
// fails every write, a probe succeeds) writes one line per interval with
// the count of changes held back, and the last one names its state.
const breakerLogEvery = 10 * time.Second

func newRedisStore(rc *config.Redis, o StoreOptions) (*Store, error) {
	log := o.Log
	if log != nil {
		redis.SetLogger(redisLogger{log}) // go-redis logs through a global; the server owns it
	} else {
		log = slog.New(slog.DiscardHandler)
	}
	client, err := NewRedisClient(rc, o.Getenv)
	if err != nil {
		return nil, fmt.Errorf("store type redis: %w", err)
	}
	var breaker atomic.Pointer[string] // the state the dashboard shows
	closed := "closed"
	breaker.Store(&closed)
	var clk sluice.Clock = clock.System{}
	if o.Clock != nil {
		clk = o.Clock
	}
	breakerLog := NewBreakerLog(log, clk, breakerLogEvery)
	skipped := newSkippedOverrides(log, clk)
	// New does not contact Redis: serve starts while Redis is down or
	// hung, answers per failure mode until it is back, and /readyz tells
	// which.
	rs, err := redisstore.New(client, redisstore.Options{Prefix: o.Prefix, Timeout: rc.Timeout, WaitReplicas: int(rc.WaitReplicas), MaxOverrides: maxOverrides, Breaker: redisstore.BreakerOptions{
		OnChange: func(state string) {
			breaker.Store(&state)
			breakerLog.Record(state) // transitions only, throttled: not one line per request
		},
	}, OnFallback: func(reason string) {
		log.Warn("redis refuses functions: decisions go as scripts (EVALSHA) from now on", "reason", reason)
	}, OnSkippedOverride: skipped.record})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("store type redis: %w", err)
	}
	return &Store{Store: rs, Type: config.StoreRedis, Ready: rs.Ready, Client: client, close: func() error {
		err := errors.Join(rs.Close(), client.Close())
		breakerLog.Stop()
		return err
	}, Breaker: func() string { return *breaker.Load() }, Skipped: skipped.n.Load}, nil
}

// NewBreakerLog logs the circuit breaker's changes of state, at most one
// line per every (on clock), the last change held back once the interval
// is over, with the count of those that were not logged. Stop it when
// done.
func NewBreakerLog(log *slog.Logger, clock sluice.Clock, every time.Duration) *logthrottle.Latest {
	return &logthrottle.Latest{Every: every, Now: clock.Now, Write: func(state string, held int64) {
		attrs := []any{"state", state}
		if held > 0 {
			attrs = append(attrs, "changes_not_logged", held)
		}
		log.Warn("redis circuit breaker", attrs...)
	}}
}

// NewRedisClient connects as rc says: a redis:// or rediss:// URL (TLS
// for rediss), or addrs of a cluster or of sentinels. The password comes
// from the environment, or from a file read again whenever it changes
// (as may the ACL user), before each new connection. Context deadlines
// bound every call.
func NewRedisClient(rc *config.Redis, getenv func(string) string) (redis.UniversalClient, error) {
	if rc == nil {
		return nil, errors.New("store.redis is missing")
	}
	password, err := rc.Password(getenv)
	if err != nil {
		return nil, err
	}
	switch {
	case rc.URL != "":
		opts, err := redis.ParseURL(rc.URL)
		if err != nil {
			return nil, fmt.Errorf("store.redis.url: %w", err)
		}
		if rc.Username != "" {
			opts.Username = rc.Username
		}
		if password != "" {
			opts.Password = password
		}
		if opts.CredentialsProviderContext, err = credentials(rc, opts.Username, opts.Password); err != nil {
			return nil, err
		}
		opts.ContextTimeoutEnabled = true
		opts.DialTimeout, opts.PoolSize = rc.DialTimeout, int(rc.PoolSize)
		opts.DialerRetries = dialAttempts
		return redis.NewClient(opts), nil
	}
	provide, err := credentials(rc, rc.Username, password)
	if err != nil {
		return nil, err
	}
	switch rc.Mode {
	case config.ModeCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs, Username: rc.Username, Password: password, CredentialsProviderContext: provide, ContextTimeoutEnabled: true,
			DialTimeout: rc.DialTimeout, PoolSize: int(rc.PoolSize), DialerRetries: dialAttempts}), nil
	case config.ModeSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: rc.MasterName, SentinelAddrs: rc.Addrs, Username: rc.Username, Password: password, CredentialsProviderContext: provide, ContextTimeoutEnabled: true,
			DialTimeout: rc.DialTimeout, PoolSize: int(rc.PoolSize), DialerRetries: dialAttempts}), nil
	}
	return nil, fmt.Errorf("store.redis: needs url, or addrs with mode %s or %s", config.ModeCluster, config.ModeSentinel)
}

// dialAttempts is how many times a connection is dialled before the
// decision fails: once. go-redis's default (5, 100ms apart) made every
// decision wait ~400ms for a refused connection; the circuit breaker and
// the next decision retry soon enough.
const dialAttempts = 1

// redisLogger sends go-redis's own log lines (dial retries, pool trouble)
// to the server's log instead of the standard logger.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "detail", fmt.Sprintf(format, v...))
}

// NewFallbackStore is the store of the proxy's local fallback limiters
// (policies with failure_mode: local), nil without a proxy section. It
// is built once, with the proxy section whose presence only a restart
// changes, so that what a fallback counted survives a reload; a reload
// that adds a local policy finds it ready.
func NewFallbackStore(cfg *config.Config, clock sluice.Clock) (*Store, error) {
	if cfg.Proxy == nil {
		return nil, nil
	}
	// Bounded as the embedded store is; it fills only while the store
	// fails.
	maxKeys := memoryMaxKeys(cfg.Store.Memory, debug.SetMemoryLimit(-1))
	ms, err := memstore.New(memstore.Options{Clock: clock, MaxKeys: maxKeys})
	if err != nil {
		return nil, fmt.Errorf("local fallback store: %w", err)
	}
	return &Store{Store: ms, Type: config.StoreMemory, MaxKeys: maxKeys, close: ms.Close}, nil
}

// SplitList splits a comma-separated list of addresses (sluice bench's
// --redis-addrs), dropping spaces and empty items.
func SplitList(s string) []string {
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
