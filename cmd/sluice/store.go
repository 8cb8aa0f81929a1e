package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

// storeHandle is a store built from the config with what serve needs
// around it.
type storeHandle struct {
	store     sluice.Store
	ready     []server.Check // readiness checks for GET /readyz
	close     func() error
	evictions func() int64     // nil: the store evicts nothing
	lostIDs   func() int64     // remembered ids evicted alive; nil: none
	info      server.StoreInfo // for the dashboard
}

// newStore builds the store the config names. It is the one place where
// store types are wired into the binary.
func newStore(ctx context.Context, cfg *config.Config, clock sluice.Clock, getenv func(string) string, log *slog.Logger) (*storeHandle, error) {
	switch cfg.Store.Type {
	case config.StoreMemory:
		ms, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			return nil, fmt.Errorf("store type memory: %w", err)
		}
		return &storeHandle{store: ms, close: ms.Close, evictions: ms.Evictions, lostIDs: ms.EvictedIDs, info: server.StoreInfo{Type: config.StoreMemory}}, nil
	case config.StoreRedis:
		redis.SetLogger(redisLogger{log}) // go-redis logs through a global; this binary owns it
		client, err := newRedisClient(cfg.Store.Redis, getenv)
		if err != nil {
			return nil, fmt.Errorf("store type redis: %w", err)
		}
		// Lazy: serve starts while Redis is down or hung, answers per
		// failure mode until it is back, and /readyz tells which.
		var breaker atomic.Pointer[string] // the state the dashboard shows
		closed := "closed"
		breaker.Store(&closed)
		rs, err := redisstore.New(client, redisstore.Options{Lazy: true, Timeout: cfg.Store.Redis.Timeout, Breaker: redisstore.BreakerOptions{
			OnChange: func(state string) {
				breaker.Store(&state)
				log.Warn("redis circuit breaker", "state", state) // transitions only: not one line per request
			},
		}})
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("store type redis: %w", err)
		}
		return &storeHandle{store: rs, ready: []server.Check{rs.Ready}, close: func() error {
			return errors.Join(rs.Close(), client.Close())
		}, info: server.StoreInfo{Type: config.StoreRedis, Breaker: func() string { return *breaker.Load() }}}, nil
	}
	return nil, fmt.Errorf("store type %q: unknown", cfg.Store.Type)
}

// newRedisClient connects as the config says: a redis:// or rediss:// URL
// (TLS for rediss), or addrs of a cluster or of sentinels. The password
// comes from the environment. Context deadlines bound every call.
func newRedisClient(rc *config.Redis, getenv func(string) string) (redis.UniversalClient, error) {
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
			DialTimeout: rc.DialTimeout, PoolSize: int(rc.PoolSize)}), nil
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
