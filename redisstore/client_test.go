package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// tracedCluster is an application's own wrapper of a cluster client, as
// a tracing or metrics layer would be: the store must see through it
// that it talks to a Cluster.
type tracedCluster struct {
	*redis.ClusterClient
	calls *atomic.Int64
}

func (c tracedCluster) Process(ctx context.Context, cmd redis.Cmder) error {
	c.calls.Add(1)
	return c.ClusterClient.Process(ctx, cmd)
}

// subjectsPerMaster returns n subjects of the test's own for each master
// of c, keyed by the master's address.
func subjectsPerMaster(t *testing.T, c *redis.ClusterClient, n int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := map[string][]string{}
	base := subject(t)
	for i := 0; i < 10_000; i++ {
		subj := fmt.Sprintf("%s.%d", base, i)
		m, err := c.MasterForKey(ctx, "{"+subj+"}")
		if err != nil {
			t.Fatal(err)
		}
		addr := m.Options().Addr
		if len(out[addr]) < n {
			out[addr] = append(out[addr], subj)
		}
		full := len(out) == 3
		for _, s := range out {
			full = full && len(s) == n
		}
		if full {
			return out
		}
	}
	t.Fatalf("no %d subjects on each of the cluster's masters: %v", n, out)
	return nil
}

// TestWrappedClusterClient: a store over an application's wrapper of a
// *redis.ClusterClient (embedding it) loads its function library on
// every master, and decides exactly for subjects on each of them.
func TestWrappedClusterClient(t *testing.T) {
	redistest.Long(t)
	ctx := context.Background()
	c := clusterClient(t)
	// Start from masters that hold no code, so what Ready loads shows.
	var mu sync.Mutex
	flushed := 0
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if err := m.FunctionFlush(ctx).Err(); err != nil {
			return err
		}
		mu.Lock()
		flushed++
		mu.Unlock()
		return m.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	if flushed != 3 {
		t.Fatalf("flushed %d masters, want 3", flushed)
	}
	var calls atomic.Int64
	s := newStore(t, tracedCluster{c, &calls}, redisstore.Options{Senders: -1})
	waitReady(t, s)
	libs := map[string]int{}
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		list, err := m.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "sluice_*"}).Result()
		mu.Lock()
		libs[m.Options().Addr] = len(list)
		mu.Unlock()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for addr, n := range libs {
		if n != 1 {
			t.Errorf("master %s holds %d sluice function libraries once Ready, want 1 (libraries per master: %v)", addr, n, libs)
		}
	}
	if len(libs) != 3 {
		t.Fatalf("libraries per master %v, want 3 masters", libs)
	}
	p := policy(t, "wrapped", sluice.FixedWindow, 2, time.Hour)
	for addr, subjects := range subjectsPerMaster(t, c, 2) {
		for _, subj := range subjects {
			for i, want := range []bool{true, true, false} {
				st, err := evaluate(ctx, s, subj, 1, p)
				if err != nil {
					t.Fatalf("decision %d for %s (master %s): %v", i, subj, addr, err)
				}
				if st[0].Allowed != want || st[0].Remaining != max(1-int64(i), 0) {
					t.Fatalf("decision %d for %s (master %s) = %+v, want allowed %v, remaining %d", i, subj, addr, st[0], want, max(1-int64(i), 0))
				}
			}
		}
	}
	if calls.Load() == 0 {
		t.Fatal("the decisions did not go through the wrapper")
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("Ready over the wrapper: %v", err)
	}
}

// wrappedClient and wrappedRing are an application's wrappers of a
// *redis.Client (a Sentinel failover client too) and of a *redis.Ring.
type (
	wrappedClient struct{ *redis.Client }
	wrappedRing   struct{ *redis.Ring }
)

// TestClientKinds: a store over an application's wrapper (embedding it)
// of a *redis.Client, of a Sentinel failover client, and of a Ring over
// two servers loads its function library on every node and decides
// exactly, alone and queued.
func TestClientKinds(t *testing.T) {
	ctx := context.Background()
	one := redistest.Standalone(t)
	two := redistest.Standalone(t)
	sentinel, err := redistest.StartSentinel(one, "sluice-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sentinel.Stop)
	for _, tc := range []struct {
		name   string
		client func() redis.UniversalClient
		nodes  []*redistest.Server
	}{
		{"client", func() redis.UniversalClient { return wrappedClient{one.Client()} }, []*redistest.Server{one}},
		{"sentinel", func() redis.UniversalClient {
			return wrappedClient{redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "sluice-test", SentinelAddrs: []string{sentinel.Addr}, ContextTimeoutEnabled: true})}
		}, []*redistest.Server{one}},
		{"ring", func() redis.UniversalClient {
			return wrappedRing{redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": one.Addr, "two": two.Addr}, ContextTimeoutEnabled: true})}
		}, []*redistest.Server{one, two}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range tc.nodes {
				nc := n.Client()
				if err := nc.FunctionFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				nc.Close()
			}
			c := tc.client()
			defer c.Close()
			s := newStore(t, c, redisstore.Options{})
			waitReady(t, s)
			for _, n := range tc.nodes {
				nc := n.Client()
				list, err := nc.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "sluice_*"}).Result()
				nc.Close()
				if err != nil || len(list) != 1 {
					t.Fatalf("node %s holds %d sluice libraries (%v) once Ready, want 1", n.Addr, len(list), err)
				}
			}
			p := policy(t, "kinds", sluice.FixedWindow, 10, time.Hour)
			for i := range 8 { // subjects on both shards of the ring
				subj := fmt.Sprint(subject(t), i)
				var wg sync.WaitGroup
				var allowed atomic.Int64
				for range 12 { // queued behind one another: more than the limit
					wg.Go(func() {
						st, err := evaluate(ctx, s, subj, 1, p)
						if err != nil {
							t.Error(err)
							return
						}
						if st[0].Allowed {
							allowed.Add(1)
						}
					})
				}
				wg.Wait()
				if n := allowed.Load(); n != 10 {
					t.Fatalf("subject %d: %d of 12 decisions allowed, want the limit of 10", i, n)
				}
			}
			if err := s.Ready(ctx); err != nil {
				t.Fatalf("Ready: %v", err)
			}
		})
	}
}
