// Package redistest starts real redis-server processes for tests: a
// standalone server, a replica of one, a Sentinel monitoring one, a
// Sentinel deployment (a master, a replica and three redis-sentinel
// processes, to fail over: Sentinels), a Redis Cluster of three masters
// (with one replica each), and a server with a least-privilege ACL user. Each listens on free loopback ports with its
// files in a temporary directory, and is stopped by killing the process it
// started (by PID), never by name.
//
// The t-taking helpers (Standalone, Replica, Cluster, ACL) stop their
// servers in t.Cleanup. StartServer, StartReplica, StartSentinel and
// StartCluster return servers the caller stops, for sharing one server per
// test package from TestMain.
//
// When redis-server is not installed, every helper fails with the command
// that installs it (InstallHint).
package redistest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstallHint is the command that installs redis-server on Debian and
// Ubuntu; the error of a missing binary quotes it.
const InstallHint = "apt-get update && apt-get install -y redis-server"

// startTimeout bounds how long a server (or a cluster) may take to answer.
const startTimeout = 30 * time.Second

// Server is one running redis-server process.
type Server struct {
	// Addr is the host:port it listens on, e.g. "127.0.0.1:40123".
	Addr string
	// Dir is its working directory (config, logs, dumps), removed by Stop.
	Dir string

	bin      string
	port     int
	config   []string
	sentinel bool       // runs as a Redis Sentinel (redis-server --sentinel)
	mu       sync.Mutex // guards cmd and exited across Kill and Restart
	cmd      *exec.Cmd
	exited   chan struct{}
	stopOnce sync.Once
	removeMe bool
}

// binaries returns the paths of redis-server and redis-cli or an error that
// says how to install them.
func binaries() (server, cli string, err error) {
	server, err = exec.LookPath("redis-server")
	if err != nil {
		return "", "", fmt.Errorf("redistest: redis-server is not installed; install it with: %s", InstallHint)
	}
	cli, err = exec.LookPath("redis-cli")
	if err != nil {
		return "", "", fmt.Errorf("redistest: redis-cli is not installed; install it with: %s", InstallHint)
	}
	return server, cli, nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartServer starts a redis-server on a free loopback port with the given
// extra config lines (e.g. "maxmemory 10mb") and waits until it logs that
// it is ready and accepts a connection. dir, when empty, is a new temporary
// directory removed by Stop.
// The caller must Stop it.
func StartServer(dir string, config ...string) (*Server, error) {
	return StartServerWith("", dir, config...)
}

// StartServerWith is StartServer with the redis-server at bin (a build of
// its own, or one a benchmark names); "" is the one on PATH.
func StartServerWith(bin, dir string, config ...string) (*Server, error) {
	if bin == "" {
		var err error
		if bin, _, err = binaries(); err != nil {
			return nil, err
		}
	}
	var err error
	remove := false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "redistest-"); err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		remove = true
	}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind: retry
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		s, err := start(bin, dir, port, config, false)
		if err == nil {
			s.removeMe = remove
			return s, nil
		}
		lastErr = err
	}
	if remove {
		os.RemoveAll(dir)
	}
	return nil, lastErr
}

func start(bin, dir string, port int, config []string, sentinel bool) (*Server, error) {
	conf := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(port),
		"dir " + dir,
		"daemonize no",
		"save \"\"",
		"appendonly no",
		"logfile " + filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)),
		"protected-mode no",
	}
	conf = append(conf, config...)
	path := filepath.Join(dir, fmt.Sprintf("redis-%d.conf", port))
	if err := os.WriteFile(path, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	cmd := exec.Command(bin, path)
	ready := []byte("Ready to accept connections")
	if sentinel {
		cmd = exec.Command(bin, path, "--sentinel")
		ready = []byte("+monitor master") // a Sentinel logs no "Ready"; this once it monitors its master
	}
	cmd.Dir = dir
	cmd.SysProcAttr = dieWithParent()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: start redis-server: %w", err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, bin: bin, port: port, config: config, sentinel: sentinel, cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(s.exited) }()
	// Ready when this process says so in its own log: a successful dial
	// alone could reach another server that took the port first (this one
	// then fails to bind and exits, which the select below reports).
	logPath := filepath.Join(dir, fmt.Sprintf("redis-%d.log", port))
	deadline := time.Now().Add(startTimeout)
	for {
		if log, err := os.ReadFile(logPath); err == nil && bytes.Contains(log, ready) {
			if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
				c.Close()
				return s, nil
			}
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("redistest: redis-server on port %d exited: %s%s", port, stderr.String(), tail(log))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("redistest: redis-server on port %d did not listen within %v", port, startTimeout)
		}
	}
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop kills the process (by its PID) and waits for it to exit, then removes
// the directory StartServer created. It is safe to call more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.Kill()
		if s.removeMe {
			os.RemoveAll(s.Dir)
		}
	})
}

// Kill kills the process (by its PID), as a crash would, and waits for it
// to exit; its port and directory stay for Restart.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd.Process != nil {
		s.cmd.Process.Kill()
	}
	<-s.exited
}

// Restart kills the process if it runs and starts a new one on the same
// port with the same config (and no data: nothing is saved), as a Redis
// brought back after a crash.
func (s *Server) Restart() error {
	s.Kill()
	// The new process is ready when its log says so: not the old one's.
	os.Remove(filepath.Join(s.Dir, fmt.Sprintf("redis-%d.log", s.port)))
	n, err := start(s.bin, s.Dir, s.port, s.config, s.sentinel)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.exited = n.cmd, n.exited
	s.mu.Unlock()
	return nil
}

// PID is the process id of the server's current process.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

// Promote makes s, a replica, a master of its own (REPLICAOF NO ONE), as
// a failover would; a later Restart starts it as a master too.
func (s *Server) Promote(ctx context.Context) error {
	c := s.Client()
	defer c.Close()
	if err := c.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return fmt.Errorf("redistest: promote %s: %w", s.Addr, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.config = slices.DeleteFunc(slices.Clone(s.config), func(line string) bool { return strings.HasPrefix(line, "replicaof ") })
	return nil
}

// Pause stops the process with SIGSTOP: it keeps its socket open, accepts
// connections, and answers nothing until Resume.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Signal(sigStop)
}

// Resume continues a paused process.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Signal(sigCont)
}

// Client returns a new go-redis client for s; the caller closes it.
func (s *Server) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
}

// Standalone starts a redis-server for the test and stops it in t.Cleanup.
func Standalone(t testing.TB) *Server {
	t.Helper()
	s, err := StartServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartReplica starts a redis-server (master's binary) that replicates
// master (replicaof, with the extra config lines given) and waits until its link to the
// master is up and the master counts it among its connected replicas, so
// a WAIT on the master can be acknowledged by it. It sets the master's
// repl-diskless-sync-delay to 0 first (Redis's default waits 5s for more
// replicas before the first sync). The caller must Stop it.
func StartReplica(master *Server, config ...string) (*Server, error) {
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	m := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer m.Close()
	if err := m.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		return nil, fmt.Errorf("redistest: master %s: %w", master.Addr, err)
	}
	s, err := StartServerWith(master.bin, "", append([]string{"replicaof " + host + " " + port}, config...)...)
	if err != nil {
		return nil, err
	}
	r := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer r.Close()
	for {
		repl, err := r.Info(ctx, "replication").Result()
		up := err == nil && strings.Contains(repl, "master_link_status:up")
		if up {
			info, err := m.Info(ctx, "replication").Result()
			up = err == nil && strings.Contains(info, "ip="+host+",port="+strconv.Itoa(s.port)+",state=online")
		}
		if up {
			return s, nil
		}
		select {
		case <-ctx.Done():
			s.Stop()
			return nil, fmt.Errorf("redistest: replica %s of %s not in sync within %v", s.Addr, master.Addr, startTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Replica starts a replica of master for the test and stops it in
// t.Cleanup.
func Replica(t testing.TB, master *Server) *Server {
	t.Helper()
	s, err := StartReplica(master)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on a
// free loopback port that monitors master under the name name, with a
// quorum of 1, and waits until it does. The caller must Stop it.
func StartSentinel(master *Server, name string) (*Server, error) {
	bin, _, err := binaries()
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	var lastErr error
	for range 5 {
		p, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redistest: %w", err)
		}
		s, err := start(bin, dir, p, []string{"sentinel monitor " + name + " " + host + " " + port + " 1"}, true)
		if err == nil {
			s.removeMe = true
			return s, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// ACLServer is a redis-server whose default user needs a password and
// whose application user may run only what the Redis store needs.
type ACLServer struct {
	*Server
	// Username and Password are the restricted user's credentials.
	Username, Password string
	// AdminPassword is the default user's password.
	AdminPassword string
}

// ACLUser returns the ACL rule of the restricted user for keys under
// prefix: FCALL and FUNCTION LOAD, EVALSHA and SCRIPT LOAD, PING, and the
// data commands the store and its code call (HGETALL, HLEN and INCR
// for overrides, HMGET for the RLQS ledger), on prefix* keys only. Everything
// else, EVAL included, is denied.
func ACLUser(prefix string) string {
	return "resetkeys resetchannels -@all ~" + prefix + "* " +
		"+fcall +function|load +evalsha +script|load +ping +time +pttl +pexpire +del +get +set +hget +hmget +hset +hdel +hgetall +hlen +incr " +
		"+llen +lindex +lrange +ltrim +rpush +zscore +zadd +zcard +zrange +zrangebyscore +zremrangebyscore +zremrangebyrank +zrank +zrem +setrange"
}

// StartACL starts a server with a default user protected by a password and
// a user "sluice" restricted by ACLUser(prefix). The caller must Stop it.
func StartACL(prefix string) (*ACLServer, error) {
	a := &ACLServer{Username: "sluice", Password: "sluice-test-pw", AdminPassword: "admin-test-pw"}
	s, err := StartServer("",
		"user default on >"+a.AdminPassword+" ~* &* +@all",
		"user "+a.Username+" on >"+a.Password+" "+ACLUser(prefix),
	)
	if err != nil {
		return nil, err
	}
	a.Server = s
	return a, nil
}

// ACL starts an ACLServer for keys under prefix for the test and stops it in
// t.Cleanup.
func ACL(t testing.TB, prefix string) *ACLServer {
	t.Helper()
	a, err := StartACL(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

// UserClient returns a client logged in as the restricted user.
func (a *ACLServer) UserClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: a.Addr, Username: a.Username, Password: a.Password, ContextTimeoutEnabled: true})
}

// AdminClient returns a client logged in as the default user.
func (a *ACLServer) AdminClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: a.Addr, Password: a.AdminPassword, ContextTimeoutEnabled: true})
}
