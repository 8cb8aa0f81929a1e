package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// rig is Redis and the proxy in front of it: the master sluice serve
// reaches through the proxy, and the replicas that took over from killed
// masters.
type rig struct {
	o      *options
	dir    string
	master *redistest.Server
	old    []*redistest.Server // masters failed over from, killed
	proxy  *proxy
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

// persistent are the config lines of every redis-server of the rig: an
// append-only file fsynced on every write, so a kill -9 loses nothing it
// acknowledged and a restart finds it again.
var persistent = []string{"appendonly yes", "appendfsync always"}

// startRedis starts the first master, in a directory of its own on a free
// port (redistest).
func (r *rig) startRedis() (*redistest.Server, error) {
	dir := filepath.Join(r.dir, "redis-1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return redistest.StartServerWith(r.o.redisServer, dir, persistent...)
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

// failover starts a replica of the master, in sync with it,
// kills the master, and a second later promotes the replica and points
// the proxy at it.
func (r *rig) failover(ctx context.Context) (fault, error) {
	f := fault{name: "failover"}
	replica, err := redistest.StartReplica(r.master, persistent...) // in sync when it returns
	if err != nil {
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
