package wiring_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/server/config"
	"github.com/sluicehq/sluice/internal/wiring"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestBreakerLogIsThrottled flaps the breaker as a read-only replica did
// (63 changes that were 63 WARN lines in 3.2s): one line per interval,
// the count of the changes not logged, and the state it ends in.
func TestBreakerLogIsThrottled(t *testing.T) {
	var out syncBuffer
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
	clock.Advance(time.Second) // the interval is over: the held-back state is written
	for range 400 {
		if len(lines()) == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if l := lines(); len(l) != 2 || !strings.HasSuffix(l[1], `msg="redis circuit breaker" state=closed changes_not_logged=62`) {
		t.Fatalf("after the interval the log is %q, want a second line: closed, 62 changes not logged", l)
	}
}

// syncBuffer is a bytes.Buffer safe for the log's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
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
