package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStandalone(t *testing.T) {
	s := Standalone(t)
	c := s.Client()
	defer c.Close()
	if got, err := c.Ping(context.Background()).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING = %q, %v, want PONG", got, err)
	}
}

func TestReplica(t *testing.T) {
	m := Standalone(t)
	r := Replica(t, m)
	mc, rc := m.Client(), r.Client()
	defer mc.Close()
	defer rc.Close()
	ctx := context.Background()
	if err := mc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := mc.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 on the master = %d, %v, want 1 replica", n, err)
	}
	if v, err := rc.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET on the replica = %q, %v, want the master's write", v, err)
	}
}

func TestSentinel(t *testing.T) {
	m := Standalone(t)
	s, err := StartSentinel(m, "mymaster")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{s.Addr}})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the Sentinel failover client: %v", err)
	}
	mc := m.Client()
	defer mc.Close()
	if v, err := mc.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET on the master = %q, %v, want the failover client's write", v, err)
	}
}

func TestCluster(t *testing.T) {
	cl := Cluster(t)
	if len(cl.Masters) != 3 || len(cl.Replicas) != 3 {
		t.Fatalf("cluster has %d masters, %d replicas, want 3, 3", len(cl.Masters), len(cl.Replicas))
	}
	c := cl.Client()
	defer c.Close()
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d"} {
		if err := c.Set(ctx, k, "1", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("CLUSTER INFO = %q, %v", info, err)
	}
}

func TestACL(t *testing.T) {
	a := ACL(t, "p:")
	ctx := context.Background()
	u := a.UserClient()
	defer u.Close()
	if err := u.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING as %s: %v", a.Username, err)
	}
	if err := u.Append(ctx, "p:x", "1").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("APPEND as %s = %v, want NOPERM", a.Username, err)
	}
	if err := u.Set(ctx, "other:x", "1", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("SET outside the prefix as %s = %v, want NOPERM", a.Username, err)
	}
	if err := u.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("EVAL as %s = %v, want NOPERM", a.Username, err)
	}
	anon := a.Server.Client()
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil {
		t.Fatal("PING without a password succeeded, want NOAUTH")
	}
}

// TestSentinelsFailOver: three Sentinels promote the replica within
// failoverTimeout of the master's death, and a failover client of theirs
// reaches the new master with the write replicated before.
func TestSentinelsFailOver(t *testing.T) {
	s := SentinelSet(t, "failover")
	c := s.Client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client: %v", err)
	}
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v, want the replica's acknowledgement", n, err)
	}
	s.Master.Kill()
	killed := time.Now()
	if err := s.WaitFailover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("replica promoted %v after the master was killed", time.Since(killed).Round(time.Millisecond))
	var v string
	var err error
	for range 100 { // the client learns of the switch from the Sentinels
		if v, err = c.Get(ctx, "k").Result(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || v != "v" {
		t.Fatalf("GET after the failover = %q, %v, want the replicated write", v, err)
	}
}
