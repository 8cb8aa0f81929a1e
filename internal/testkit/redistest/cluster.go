package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterServers is a running Redis Cluster.
type ClusterServers struct {
	// Addrs are the masters' addresses, then the replicas'.
	Addrs []string
	// Masters are the master processes; Replicas the replica processes
	// (possibly none).
	Masters, Replicas []*Server
}

// Client returns a new go-redis cluster client for c; the caller closes it.
func (c *ClusterServers) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ContextTimeoutEnabled: true})
}

// Stop stops every node.
func (c *ClusterServers) Stop() {
	var wg sync.WaitGroup
	for _, s := range append(append([]*Server(nil), c.Masters...), c.Replicas...) {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// StartCluster starts a Redis Cluster of masters masters with replicas
// replicas each, creates it with redis-cli --cluster create, and waits until
// every node reports cluster_state:ok and agrees on the slot map. Extra
// config lines apply to every node and override the defaults (e.g.
// "cluster-node-timeout 1000" for a faster failover than the default 5s).
// The caller must Stop it.
func StartCluster(masters, replicas int, config ...string) (c *ClusterServers, err error) {
	_, cli, err := binaries()
	if err != nil {
		return nil, err
	}
	c = &ClusterServers{}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	n := masters * (1 + replicas)
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// The cluster bus port is set explicitly, so it need not be
			// port+10000; it too can be taken between probe and bind, so a
			// failed start tries a new pair.
			for range 5 {
				bus, err := freePort()
				if err != nil {
					errs[i] = err
					return
				}
				servers[i], errs[i] = StartServer("", append([]string{
					"cluster-enabled yes",
					"cluster-port " + strconv.Itoa(bus),
					"cluster-config-file nodes.conf",
					"cluster-node-timeout 5000",
				}, config...)...)
				if errs[i] == nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for i, s := range servers {
		if s != nil {
			if i < masters {
				c.Masters = append(c.Masters, s)
			} else {
				c.Replicas = append(c.Replicas, s)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	for _, s := range servers {
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return c, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := waitClusterOK(ctx, c, replicas); err != nil {
		return c, err
	}
	return c, nil
}

// waitClusterOK waits until every node says cluster_state:ok, knows every
// other node, and the replicas have finished their first sync.
func waitClusterOK(ctx context.Context, c *ClusterServers, replicas int) error {
	var last string
	for {
		ok := true
		for _, addr := range c.Addrs {
			cl := redis.NewClient(&redis.Options{Addr: addr})
			info, err := cl.ClusterInfo(ctx).Result()
			var nodes string
			if err == nil {
				nodes, err = cl.ClusterNodes(ctx).Result()
			}
			var repl string
			if err == nil {
				repl, err = cl.Info(ctx, "replication").Result()
			}
			cl.Close()
			switch {
			case err != nil:
				ok, last = false, err.Error()
			case !strings.Contains(info, "cluster_state:ok"):
				ok, last = false, addr+": "+firstLine(info)
			case strings.Count(strings.TrimSpace(nodes), "\n")+1 != len(c.Addrs) || strings.Contains(nodes, "handshake") || strings.Contains(nodes, "noaddr"):
				ok, last = false, addr+" does not know every node yet"
			case strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up"):
				ok, last = false, addr+": replica link not up"
			case replicas > 0 && strings.Contains(repl, "role:master") && !strings.Contains(repl, "connected_slaves:"+strconv.Itoa(replicas)):
				ok, last = false, addr+": replicas not connected"
			}
			if !ok {
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster not ready within %v: %s", startTimeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ReplicasOf returns the replicas of the master at addr.
func (c *ClusterServers) ReplicasOf(ctx context.Context, addr string) ([]*Server, error) {
	host, port, _ := net.SplitHostPort(addr)
	var out []*Server
	for _, s := range c.Replicas {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr})
		repl, err := cl.Info(ctx, "replication").Result()
		cl.Close()
		if err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		if strings.Contains(repl, "master_host:"+host+"\r\n") && strings.Contains(repl, "master_port:"+port+"\r\n") {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("redistest: no replica of %s", addr)
	}
	return out, nil
}

// WaitOnePromoted waits until one of replicas (of the master at dead,
// killed) is promoted as WaitPromoted tells, and returns it.
func (c *ClusterServers) WaitOnePromoted(ctx context.Context, replicas []*Server, dead string) (*Server, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	won := make(chan *Server, len(replicas))
	errs := make(chan error, len(replicas))
	for _, r := range replicas {
		go func() {
			if err := c.WaitPromoted(ctx, r, dead); err != nil {
				errs <- err
				return
			}
			won <- r
		}()
	}
	var last error
	for range replicas {
		select {
		case r := <-won:
			return r, nil
		case last = <-errs:
		}
	}
	return nil, last
}

// ReplicaOf returns a replica of the master at addr.
func (c *ClusterServers) ReplicaOf(ctx context.Context, addr string) (*Server, error) {
	rs, err := c.ReplicasOf(ctx, addr)
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// WaitPromoted waits until replica says it is a master and every node but
// the one at dead (a master that was killed) says cluster_state:ok: the
// replica has taken over dead's slots.
func (c *ClusterServers) WaitPromoted(ctx context.Context, replica *Server, dead string) error {
	last := ""
	for {
		cl := redis.NewClient(&redis.Options{Addr: replica.Addr})
		repl, err := cl.Info(ctx, "replication").Result()
		cl.Close()
		ok := err == nil && strings.Contains(repl, "role:master")
		if !ok {
			last = replica.Addr + " is not a master yet"
		}
		for _, a := range c.Addrs {
			if !ok || a == dead {
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: a})
			info, err := cl.ClusterInfo(ctx).Result()
			cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok, last = false, a+" says the cluster is not ok"
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: %s not promoted: %s", replica.Addr, last)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func firstLine(s string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Scan()
	return sc.Text()
}

// Cluster starts a 3-master Redis Cluster with one replica per master for
// the test and stops it in t.Cleanup.
func Cluster(t testing.TB) *ClusterServers {
	t.Helper()
	c, err := StartCluster(3, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}
