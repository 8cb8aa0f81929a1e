package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/internal/server/config"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

// storeHandle is a store built from the config with what Run needs
// around it.
type storeHandle struct {
	store     sluice.Store
	ready     []Check // readiness checks for GET /readyz
	close     func() error
	evictions func() int64 // nil: the store evicts nothing
	lostIDs   func() int64 // remembered ids evicted alive; nil: none
	skipped   func() int64 // unreadable overrides skipped; nil: the store reads every one
	info      StoreInfo    // for the dashboard
}

// newStore builds the store the config names. It is the one place where
// store types are wired into the server.
func newStore(cfg *config.Config, clock sluice.Clock, getenv func(string) string, log *slog.Logger) (*storeHandle, error) {
	switch cfg.Store.Type {
	case config.StoreMemory:
		ms, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			return nil, fmt.Errorf("store type memory: %w", err)
		}
		return &storeHandle{store: ms, close: ms.Close, evictions: func() int64 { n, _ := ms.Evictions(); return n }, lostIDs: func() int64 { _, n := ms.Evictions(); return n }, info: StoreInfo{Type: config.StoreMemory}}, nil
	case config.StoreRedis:
		return newRedisStore(cfg.Store.Redis, clock, getenv, log)
	}
	return nil, fmt.Errorf("store type %q: unknown", cfg.Store.Type)
}

// breakerLogEvery is the least time between two log lines of the Redis
// circuit breaker's state: a breaker that flaps (a read-only replica
// fails every write, a probe succeeds) writes one line per interval with
// the count of changes held back, and the last one names its state.
const breakerLogEvery = 10 * time.Second

func newRedisStore(rc *config.Redis, clock sluice.Clock, getenv func(string) string, log *slog.Logger) (*storeHandle, error) {
	redis.SetLogger(redisLogger{log}) // go-redis logs through a global; the server owns it
	client, err := NewRedisClient(rc, getenv)
	if err != nil {
		return nil, fmt.Errorf("store type redis: %w", err)
	}
	var breaker atomic.Pointer[string] // the state the dashboard shows
	closed := "closed"
	breaker.Store(&closed)
	breakerLog := newBreakerLog(log, clock, breakerLogEvery)
	skipped := newSkippedOverrides(log, clock)
	// New does not contact Redis: serve starts while Redis is down or
	// hung, answers per failure mode until it is back, and /readyz tells
	// which.
	rs, err := redisstore.New(client, redisstore.Options{Timeout: rc.Timeout, WaitReplicas: int(rc.WaitReplicas), Breaker: redisstore.BreakerOptions{
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
	return &storeHandle{store: rs, ready: []Check{rs.Ready}, close: func() error {
		err := errors.Join(rs.Close(), client.Close())
		breakerLog.Stop()
		return err
	}, skipped: skipped.n.Load, info: StoreInfo{Type: config.StoreRedis, Breaker: func() string { return *breaker.Load() }}}, nil
}

// newBreakerLog logs the circuit breaker's changes of state, at most one
// line per every (on clock), the last change held back once the interval
// is over, with the count of those that were not logged.
func newBreakerLog(log *slog.Logger, clock sluice.Clock, every time.Duration) *logthrottle.Latest {
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
// from the environment. Context deadlines bound every call.
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
		opts.ContextTimeoutEnabled = true
		opts.DialTimeout, opts.PoolSize = rc.DialTimeout, int(rc.PoolSize)
		opts.DialerRetries = dialAttempts
		return redis.NewClient(opts), nil
	case rc.Mode == config.ModeCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs, Username: rc.Username, Password: password, ContextTimeoutEnabled: true,
			DialTimeout: rc.DialTimeout, PoolSize: int(rc.PoolSize), DialerRetries: dialAttempts}), nil
	case rc.Mode == config.ModeSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: rc.MasterName, SentinelAddrs: rc.Addrs, Username: rc.Username, Password: password, ContextTimeoutEnabled: true,
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

// newFallbackStore is the store of the proxy's local fallback limiters
// (policies with failure_mode: local), nil without a proxy section. It
// is built once, with the proxy section whose presence only a restart
// changes, so that what a fallback counted survives a reload; a reload
// that adds a local policy finds it ready.
func newFallbackStore(cfg *config.Config, clock sluice.Clock) (*memstore.Store, error) {
	if cfg.Proxy == nil {
		return nil, nil
	}
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		return nil, fmt.Errorf("local fallback store: %w", err)
	}
	return ms, nil
}
