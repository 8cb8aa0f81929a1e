package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/bench/internal/proc"
)

// rig is Redis and the proxy in front of it: the master sluice serve
// reaches through the proxy, and the replicas that took over from killed
// masters.
type rig struct {
	o      *options
	dir    string
	master *proc.Redis
	old    []*proc.Redis // masters failed over from, killed
	proxy  *proxy
	n      int // redis-servers started, for their directories
}

func startRig(o *options, dir string) (*rig, error) {
	r := &rig{o: o, dir: dir}
	m, err := r.startRedis()
	if err != nil {
		return nil, err
	}
	r.master = m
	if r.proxy, err = startProxy(m.Addr); err != nil {
		m.Stop()
		return nil, err
	}
	return r, nil
}

// startRedis starts a redis-server in a directory of its own on a free
// port, with args.
func (r *rig) startRedis(args ...string) (*proc.Redis, error) {
	r.n++
	dir := filepath.Join(r.dir, "redis-"+strconv.Itoa(r.n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	return proc.StartRedis(r.o.redisServer, dir, port, args...)
}

func (r *rig) close() {
	r.proxy.Close()
	r.master.Stop()
	for _, m := range r.old {
		m.Stop()
	}
}

// fault is one fault applied during the run.
type fault struct {
	name        string
	start, heal time.Time // applied; Redis reachable again (or the latency gone)
	note        string
}

// faultNames is the rotation, one a period.
var faultNames = []string{"kill", "hang", "latency", "failover"}

// apply applies the fault name, holds it, heals it and says when.
func (r *rig) apply(ctx context.Context, name string) (fault, error) {
	f := fault{name: name}
	var err error
	switch name {
	case "kill":
		f.start = time.Now()
		r.master.Kill()
		time.Sleep(time.Second)
		err = r.master.Restart()
		f.note = fmt.Sprintf("SIGKILL of pid %d, restarted on %s", r.master.PID(), r.master.Addr)
	case "hang":
		f.start = time.Now()
		if err = r.master.Pause(); err == nil {
			time.Sleep(r.o.hold)
			err = r.master.Resume()
		}
		f.note = fmt.Sprintf("SIGSTOP of pid %d for %s", r.master.PID(), r.o.hold)
	case "latency":
		f.start = time.Now()
		r.proxy.setDelay(r.o.latency)
		time.Sleep(r.o.hold)
		r.proxy.setDelay(0)
		f.note = fmt.Sprintf("%s each way for %s", r.o.latency, r.o.hold)
	case "failover":
		f, err = r.failover(ctx)
	}
	f.heal = time.Now()
	return f, err
}

// failover starts a replica of the master, waits for its first sync,
// kills the master, and a second later promotes the replica and points
// the proxy at it.
func (r *rig) failover(ctx context.Context) (fault, error) {
	f := fault{name: "failover"}
	host, port := "127.0.0.1", r.master.Addr[len("127.0.0.1:"):]
	replica, err := r.startRedis("--replicaof", host, port)
	if err != nil {
		return f, err
	}
	if err := replica.WaitSynced(ctx); err != nil {
		replica.Stop()
		return f, err
	}
	f.start = time.Now()
	r.master.Kill()
	time.Sleep(time.Second)
	if err := replica.Promote(ctx); err != nil {
		replica.Stop()
		return f, err
	}
	r.proxy.retarget(replica.Addr)
	f.note = fmt.Sprintf("master %s (pid %d) killed, replica %s promoted", r.master.Addr, r.master.PID(), replica.Addr)
	r.old = append(r.old, r.master)
	r.master = replica
	return f, nil
}
