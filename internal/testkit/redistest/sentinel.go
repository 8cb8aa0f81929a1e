package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelInstallHint is the command that installs redis-sentinel on
// Debian and Ubuntu; the error of a missing binary quotes it.
const SentinelInstallHint = "apt-get update && apt-get install -y redis-sentinel"

// RequireSentinelEnv is the environment variable that turns a missing
// redis-sentinel from a skipped test into a failed one: make test sets it,
// having installed redis-sentinel.
const RequireSentinelEnv = "REDISTEST_REQUIRE_SENTINEL"

// The Sentinels' timings: a master that does not answer for downAfter is
// down, and a failover is given failoverTimeout. With a quorum of 2 of 3
// Sentinels a failover finishes a few seconds after the master dies.
const (
	downAfter       = 1000 * time.Millisecond
	failoverTimeout = 5000 * time.Millisecond
)

// Sentinels is a Redis Sentinel deployment on loopback: one master, one
// replica of it, and three redis-sentinel processes monitoring it under
// Name with a quorum of 2. Every process is stopped by its PID.
type Sentinels struct {
	// Name is the master's name, the FailoverOptions.MasterName to ask for.
	Name string
	// Master and Replica are the data servers as started: after a
	// failover, Replica is the master.
	Master, Replica *Server
	// Sentinels are the three Sentinel processes.
	Sentinels []*Server
}

// Addrs returns the Sentinels' addresses, the FailoverOptions.SentinelAddrs.
func (s *Sentinels) Addrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		addrs[i] = sn.Addr
	}
	return addrs
}

// Client returns a new go-redis failover client of s; the caller closes it.
func (s *Sentinels) Client() *redis.Client {
	return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Name, SentinelAddrs: s.Addrs(), ContextTimeoutEnabled: true})
}

// Stop stops every process s started.
func (s *Sentinels) Stop() {
	var wg sync.WaitGroup
	for _, sv := range append([]*Server{s.Master, s.Replica}, s.Sentinels...) {
		if sv != nil {
			wg.Go(sv.Stop)
		}
	}
	wg.Wait()
}

// WaitFailover waits, until ctx ends, for the Sentinels to have promoted
// the Replica: a majority of them name it as the master, and it says it
// is one.
func (s *Sentinels) WaitFailover(ctx context.Context) error {
	r := s.Replica.Client()
	defer r.Close()
	for {
		agree := 0
		for _, sn := range s.Sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
			addr, err := c.GetMasterAddrByName(ctx, s.Name).Result()
			c.Close()
			if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == s.Replica.Addr {
				agree++
			}
		}
		if agree >= 2 {
			if info, err := r.Info(ctx, "replication").Result(); err == nil && strings.Contains(info, "role:master") {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: %d of %d Sentinels name the replica %s as master %q, and it is not yet one: %w", agree, len(s.Sentinels), s.Replica.Addr, s.Name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sentinelBinary returns the path of redis-sentinel, or an error that says
// how to install it.
func sentinelBinary() (string, error) {
	bin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		return "", fmt.Errorf("redistest: redis-sentinel is not installed; install it with: %s", SentinelInstallHint)
	}
	return bin, nil
}

// StartSentinels starts a master, a replica of it and three
// redis-sentinel processes monitoring it as name (configs in temporary
// directories, quorum 2, short down-after and failover timeouts), and
// waits until every Sentinel knows the replica and the two other
// Sentinels, so a failover can be agreed. The caller must Stop it.
func StartSentinels(name string) (s *Sentinels, err error) {
	bin, err := sentinelBinary()
	if err != nil {
		return nil, err
	}
	s = &Sentinels{Name: name}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if s.Master, err = StartServer(""); err != nil {
		return nil, err
	}
	if s.Replica, err = StartReplica(s.Master); err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	conf := []string{
		"sentinel monitor " + name + " " + host + " " + port + " 2",
		"sentinel down-after-milliseconds " + name + " " + strconv.FormatInt(downAfter.Milliseconds(), 10),
		"sentinel failover-timeout " + name + " " + strconv.FormatInt(failoverTimeout.Milliseconds(), 10),
		"sentinel parallel-syncs " + name + " 1",
	}
	for range 3 {
		sn, err := startSentinel(bin, conf)
		if err != nil {
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, sn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, sn := range s.Sentinels {
		if err := s.waitAcquainted(ctx, sn); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// startSentinel starts one redis-sentinel with conf in a directory of its
// own, on a free port.
func startSentinel(bin string, conf []string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind: retry
		p, err := freePort()
		if err != nil {
			lastErr = err
			break
		}
		sn, err := start(bin, dir, p, conf, true)
		if err == nil {
			sn.removeMe = true
			return sn, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: %w", lastErr)
}

// waitAcquainted waits until sn knows the replica and the two other
// Sentinels.
func (s *Sentinels) waitAcquainted(ctx context.Context, sn *Server) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
	defer c.Close()
	for {
		peers, err := c.Sentinels(ctx, s.Name).Result()
		replicas, rerr := c.Replicas(ctx, s.Name).Result()
		if err == nil && rerr == nil && len(peers) == len(s.Sentinels)-1 && len(replicas) == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: Sentinel %s knows %d other Sentinels and %d replicas of %q within %v, want %d and 1: %w",
				sn.Addr, len(peers), len(replicas), s.Name, startTimeout, len(s.Sentinels)-1, errors.Join(err, rerr, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// SentinelSet starts a Sentinel deployment for the test (StartSentinels)
// and stops it in t.Cleanup. Without redis-sentinel installed it skips
// the test, saying how to install it, unless RequireSentinelEnv is set:
// then it fails.
func SentinelSet(t testing.TB, name string) *Sentinels {
	t.Helper()
	if _, err := sentinelBinary(); err != nil {
		if os.Getenv(RequireSentinelEnv) != "" {
			t.Fatalf("%v (%s is set)", err, RequireSentinelEnv)
		}
		t.Skip(err)
	}
	s, err := StartSentinels(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}
