package proc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a redis-server this package started on a loopback port, with
// an append-only file fsynced on every write in its own directory, so a
// kill -9 loses nothing it acknowledged and a restart finds it again.
type Redis struct {
	Addr string
	bin  string
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
	out  *bytes.Buffer
}

// StartRedis starts bin on port, its files in dir, with the extra args
// (such as "--replicaof", host, port), and waits until it answers PING.
func StartRedis(bin, dir string, port int, args ...string) (*Redis, error) {
	r := &Redis{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin, dir: dir, port: port, args: args}
	return r, r.start()
}

func (r *Redis) start() error {
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "yes", "--loglevel", "warning"}, r.args...)
	r.out = &bytes.Buffer{}
	r.cmd = exec.Command(r.bin, args...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", r.bin, err)
	}
	c := r.Client()
	defer c.Close()
	for range 500 { // 10 s
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Kill()
	return fmt.Errorf("redis-server on %s did not answer PING within 10s\n%s", r.Addr, r.out.String())
}

// Client returns a new client of r that does not retry.
func (r *Redis) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
}

// quiet drops go-redis's log lines: a PING refused while a server starts
// is expected here, and the programs say what failed themselves.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }

// PID is the process id of the server's current process.
func (r *Redis) PID() int { return r.cmd.Process.Pid }

// Kill sends SIGKILL to the process and waits for it.
func (r *Redis) Kill() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
}

// Restart starts the server again on its port and directory, after Kill.
func (r *Redis) Restart() error { return r.start() }

// Pause stops the process (SIGSTOP): it keeps its connections and answers
// nothing until Resume (SIGCONT).
func (r *Redis) Pause() error { return r.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused process.
func (r *Redis) Resume() error { return r.cmd.Process.Signal(syscall.SIGCONT) }

// Stop ends the process: SIGCONT (it may be paused), SIGTERM, then
// SIGKILL after 5 s.
func (r *Redis) Stop() {
	if r == nil || r.cmd.ProcessState != nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGCONT)
	terminate(r.cmd, 5*time.Second)
}

// WaitSynced waits (at most 30 s) until r, a replica, has its link to
// its master up and its first full sync done; what the master writes
// after that reaches it asynchronously, as in production.
func (r *Redis) WaitSynced(ctx context.Context) error {
	c := r.Client()
	defer c.Close()
	for range 300 {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && infoField(info, "master_link_status") == "up" && infoField(info, "master_sync_in_progress") == "0" {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("replica %s did not sync within 30s", r.Addr)
}

// Promote makes r, a replica, a master of its own: REPLICAOF NO ONE. A
// later Restart starts it as a master too.
func (r *Redis) Promote(ctx context.Context) error {
	c := r.Client()
	defer c.Close()
	if err := c.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return err
	}
	r.args = nil
	return nil
}

// infoField returns the value of name in an INFO reply, or "".
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == name {
			return v
		}
	}
	return ""
}
