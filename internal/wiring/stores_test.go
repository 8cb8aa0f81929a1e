package wiring_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/wiring"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestBreakerLogIsThrottled flaps the breaker as a read-only replica did
// (63 changes that were 63 WARN lines in 3.2s): one line per interval,
// the count of the changes not logged, and the state it ends in.
func TestBreakerLogIsThrottled(t *testing.T) {
	out := syncBuffer{wrote: make(chan struct{}, 1)}
	lines := func() []string { return strings.Split(strings.TrimSpace(out.String()), "\n") }
	clock := sluicetest.NewClock()
	bl := wiring.NewBreakerLog(slog.New(slog.NewTextHandler(&out, nil)), clock, time.Millisecond)
	defer bl.Stop()
	states := []string{"open", "half_open"}
	for i := range 63 {
		bl.Record(states[i%2])
	}
	bl.Record("closed")
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], `level=WARN msg="redis circuit breaker" state=open`) || strings.Contains(l[0], "changes_not_logged") {
		t.Fatalf("64 changes within an interval logged %q, want one line for the first, open", l)
	}
	select { // the first line's signal
	case <-out.wrote:
	default:
	}
	clock.Advance(time.Second) // the interval is over: the held-back state is written
	select {                   // by the throttle's timer, on a goroutine of its own
	case <-out.wrote:
	case <-time.After(20 * time.Second): // a bound on a loaded machine, not a threshold
	}
	if l := lines(); len(l) != 2 || !strings.HasSuffix(l[1], `msg="redis circuit breaker" state=closed changes_not_logged=62`) {
		t.Fatalf("after the interval the log is %q, want a second line: closed, 62 changes not logged", l)
	}
}

// syncBuffer is a bytes.Buffer safe for the log's goroutine and the test.
// wrote, when set, is signalled after each write, for a test to wait on.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.wrote != nil {
		defer func() {
			select {
			case b.wrote <- struct{}{}:
			default:
			}
		}()
	}
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestNewStore builds each store a config names and takes a decision on
// it: the memory store, Redis by URL with a key prefix of its own, and an
// unknown type refused with its name.
func TestNewStore(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, c := range []struct {
		name string
		sc   config.Store
	}{
		{"memory", config.Store{Type: config.StoreMemory}},
		{"redis", config.Store{Type: config.StoreRedis, Redis: &config.Redis{URL: "redis://" + srv.Addr + "/0"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := wiring.NewStore(c.sc, wiring.StoreOptions{Prefix: "wiring-test:"})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if st.Type != c.sc.Type || (st.Client != nil) != (c.sc.Type == config.StoreRedis) || (st.Breaker != nil) != (c.sc.Type == config.StoreRedis) {
				t.Errorf("NewStore(%s) = type %q, client %v, breaker set %v; want its type, and a client and a breaker for redis only", c.name, st.Type, st.Client, st.Breaker != nil)
			}
			lim, err := sluice.New(st.Store, []sluice.Policy{{ID: "p", Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Hour}}, sluice.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i, want := range []sluice.Kind{sluice.Allowed, sluice.Denied} {
				if o := lim.Check(ctx, sluice.Request{Policy: "p", Subject: "s"}); o.Kind != want {
					t.Errorf("Check #%d on %s = %v (%v), want %v", i+1, c.name, o.Kind, o.Err, want)
				}
			}
			if st.Client != nil {
				if keys, err := st.Client.Keys(ctx, "*").Result(); err != nil || len(keys) == 0 || !strings.HasPrefix(keys[0], "wiring-test:") {
					t.Errorf("keys on Redis = %q, %v; want them under the prefix wiring-test:", keys, err)
				}
			}
		})
	}
	if _, err := wiring.NewStore(config.Store{Type: "etcd"}, wiring.StoreOptions{}); err == nil || !strings.Contains(err.Error(), `store type "etcd": unknown`) {
		t.Errorf("NewStore(etcd) = %v, want the unknown type named", err)
	}
}

// TestMemoryStoreBound: the embedded store holds at most the bound
// store.memory.max_keys sets, else the one derived from the process's
// memory limit (GOMEMLIMIT), else memstore's default; a flood of distinct
// subjects past it evicts instead of growing.
func TestMemoryStoreBound(t *testing.T) {
	const noLimit = math.MaxInt64 // the runtime's memory limit when GOMEMLIMIT is unset
	for _, c := range []struct {
		name     string
		memory   *config.Memory
		limit    int64
		wantKeys int
	}{
		{"configured", &config.Memory{MaxKeys: 2000}, noLimit, 2000},
		{"configured wins over GOMEMLIMIT", &config.Memory{MaxKeys: 2000}, 230 << 20, 2000},
		{"GOMEMLIMIT 230MiB", nil, 230 << 20, 230 << 20 / 2 / wiring.MemoryBytesPerKey},
		{"GOMEMLIMIT 4GiB", nil, 4 << 30, 4 << 30 / 2 / wiring.MemoryBytesPerKey},
		{"GOMEMLIMIT tiny: the least bound", nil, 1 << 20, config.MinMaxKeys},
		{"no GOMEMLIMIT: memstore's default", nil, noLimit, 1_000_000},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := wiring.NewStore(config.Store{Type: config.StoreMemory, Memory: c.memory}, wiring.StoreOptions{MemoryLimit: c.limit})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if st.MaxKeys != c.wantKeys {
				t.Fatalf("NewStore(memory %+v, memory limit %d).MaxKeys = %d, want %d", c.memory, c.limit, st.MaxKeys, c.wantKeys)
			}
			if c.wantKeys > 10_000 {
				return // the flood below is for the small bounds
			}
			lim, err := sluice.New(st.Store, []sluice.Policy{{ID: "p", Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Hour}}, sluice.Options{})
			if err != nil {
				t.Fatal(err)
			}
			const sent = 3 * 2000
			for i := range sent {
				if o := lim.Check(context.Background(), sluice.Request{Policy: "p", Subject: fmt.Sprint("s", i)}); o.Kind != sluice.Allowed {
					t.Fatalf("Check(s%d) = %v (%v), want allowed", i, o.Kind, o.Err)
				}
			}
			// No state expires within the hour: what is held is what was
			// sent minus what was evicted.
			if held := sent - int(st.Evictions()); held > c.wantKeys || held < c.wantKeys/2 {
				t.Errorf("after %d distinct subjects the store holds %d states, want at most the bound %d (and near it)", sent, held, c.wantKeys)
			}
		})
	}
}

// TestRedisClientsDialOnce holds every store mode to one dial attempt per
// connection: go-redis's default of 5, 100ms apart, made 32 decisions
// wait ~500ms at a Sentinel failover while url and cluster modes dialled
// once.
func TestRedisClientsDialOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		rc   config.Redis
	}{
		{"url", config.Redis{URL: "redis://127.0.0.1:1/0"}},
		{"cluster", config.Redis{Mode: config.ModeCluster, Addrs: []string{"127.0.0.1:1"}}},
		{"sentinel", config.Redis{Mode: config.ModeSentinel, MasterName: "m", Addrs: []string{"127.0.0.1:1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := wiring.NewRedisClient(&tc.rc, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var got int
			switch c := c.(type) {
			case *redis.Client:
				got = c.Options().DialerRetries
			case *redis.ClusterClient:
				got = c.Options().DialerRetries
			default:
				t.Fatalf("NewRedisClient(%s) = %T, want *redis.Client or *redis.ClusterClient", tc.name, c)
			}
			if got != 1 {
				t.Errorf("NewRedisClient(%s).Options().DialerRetries = %d, want 1", tc.name, got)
			}
		})
	}
}
