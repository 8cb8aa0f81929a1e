// Command soak runs a real `sluice serve` on the Redis store under steady
// load for a while (10 minutes by default), with one Redis fault a minute
// in rotation, and reports what a user would watch: the server's resident
// memory and goroutines every 10 s, and at the end the answers by status,
// the panics its stderr shows, how soon each fault was over, and whether
// any fixed window admitted more than its limit.
//
// It starts redis-server itself on free loopback ports (an append-only
// file fsynced on every write, so a kill -9 loses nothing acknowledged),
// a TCP proxy of its own between sluice and Redis, and the server built
// from ../cmd/sluice. The faults, each held about 5 s:
//
//	kill      redis-server killed (SIGKILL of the PID it started), restarted 1 s later
//	hang      SIGSTOP, SIGCONT 5 s later
//	latency   100 ms added each way by the proxy for 5 s
//	failover  a replica started and synced, the master killed, the replica
//	          promoted (REPLICAOF NO ONE) 1 s later and the proxy pointed at it
//
// From bench/ (RELIABILITY.md quotes the figures of a full run):
//
//	go run ./soak                     # 10 minutes
//	go run ./soak -duration 2m        # shorter: two faults
//
// Exactness is counted from the answers alone: each admission's window
// ends at about its send time + reset_after_ms (windows open at their
// first admission), so admissions of one subject are grouped by that end
// and no group may hold more than the limit.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sluicehq/sluice/bench/internal/proc"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

func main() { proc.Main("soak", run) }

type options struct {
	repo, redisServer string
	duration, every   time.Duration // the run, and between faults
	hold, report      time.Duration // a fault's length, and between reports
	latency           time.Duration
	callers, subjects int
	interval          time.Duration // between one caller's checks
	limit             int           // per window of 1 s
	keep              string        // keep the run's files here
}

// window is the policy's window: fixed_window, limit per second.
const window = time.Second

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.repo, "repo", "..", "the main module, whose ./cmd/sluice is built")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "the redis-server binary")
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the load runs")
	fs.DurationVar(&o.every, "fault-every", time.Minute, "time between faults (the first after one period of calm)")
	fs.DurationVar(&o.hold, "hold", 5*time.Second, "how long a hang or added latency lasts")
	fs.DurationVar(&o.latency, "latency", 100*time.Millisecond, "latency added each way")
	fs.DurationVar(&o.report, "report-every", 10*time.Second, "time between memory and goroutine reports")
	fs.IntVar(&o.callers, "callers", 4, "concurrent callers, each on keep-alive connections of its own")
	fs.IntVar(&o.subjects, "subjects", 8, "subjects the callers take turns on")
	fs.DurationVar(&o.interval, "interval", 10*time.Millisecond, "time between one caller's checks")
	fs.IntVar(&o.limit, "limit", 20, "the policy's limit per 1 s fixed window")
	fs.StringVar(&o.keep, "keep", "", "keep the server's log and Redis's files in this `directory` (default: a temporary one, removed)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.duration <= 0 || o.every <= 0 || o.hold <= 0 || o.report <= 0 || o.interval <= 0 || o.callers < 1 || o.subjects < 1 || o.limit < 1 {
		return nil, fmt.Errorf("durations must be positive, -callers, -subjects and -limit at least 1")
	}
	return &o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.redisServer, err = exec.LookPath(o.redisServer); err != nil {
		return fmt.Errorf("redis-server not found (install it, or pass -redis-server PATH): %w", err)
	}
	dir := o.keep
	if dir == "" {
		if dir, err = os.MkdirTemp("", "sluice-soak-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	bin, err := servetest.Build(ctx, o.repo, dir, nil)
	if err != nil {
		return err
	}
	rig, err := startRig(o, dir)
	if err != nil {
		return err
	}
	defer rig.close()
	config := filepath.Join(dir, "soak.yaml")
	yaml := fmt.Sprintf("server:\n  listen: \"127.0.0.1:0\"\nstore:\n  type: redis\n  redis: { url: \"redis://%s/0\" }\npolicies:\n  - id: soak\n    algorithm: fixed_window\n    limit: %d\n    window: %s\n", rig.proxy.Addr(), o.limit, window)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "serve.log")
	sv, err := servetest.Start(bin, servetest.Options{LogPath: logPath, Timeout: 30 * time.Second}, "serve", "-c", config)
	if err != nil {
		return err
	}
	defer sv.Stop(15 * time.Second)
	res, err := soak(ctx, o, rig, sv, stderr)
	if err != nil {
		return err
	}
	if err := sv.Stop(15 * time.Second); err != nil {
		fmt.Fprintf(stderr, "sluice serve stopped: %v\n", err)
	}
	if res.panics, err = proc.Panics(logPath); err != nil {
		return err
	}
	printReport(stdout, o, res)
	return nil
}
