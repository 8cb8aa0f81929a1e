// Package servetest builds the sluice command and runs `sluice serve` as
// a real process, for the tests and the bench module: one binary per test
// process, servers on free loopback ports, each ready when it logs the
// address of its check API (an event, never a sleep), each stopped by the
// PID this package started.
package servetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// module is the import path of the main module, whose cmd/sluice is built.
const module = "github.com/sluicehq/sluice"

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the path of cmd/sluice, built once per test process with
// the Dockerfile's settings (CGO_ENABLED=0, -trimpath), so that every
// package's tests and the deploy test's build find it compiled alike.
// Cleanup removes it.
func Binary(tb testing.TB) string {
	tb.Helper()
	binOnce.Do(func() {
		root, err := Root(context.Background())
		if err != nil {
			binErr = err
			return
		}
		dir, err := os.MkdirTemp("", "sluice-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath, binErr = Build(context.Background(), root, dir, []string{"CGO_ENABLED=0"}, "-trimpath")
	})
	if binErr != nil {
		tb.Fatal(binErr)
	}
	return binPath
}

// Cleanup removes the binary Binary built, if any. Call it from TestMain
// after m.Run.
func Cleanup() {
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
}

// Root returns the directory of the main module, as the go command sees
// it from the current directory: the module itself, or the directory a
// replace directive names (the bench module's ../).
func Root(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("servetest: go list -m %s: %w\n%s", module, err, ee.Stderr)
		}
		return "", fmt.Errorf("servetest: go list -m %s: %w (the go command is needed to build cmd/sluice)", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Build builds ./cmd/sluice of the module at root into dir, with the
// extra environment env (such as CGO_ENABLED=0) and go build flags, and
// returns the binary's path.
func Build(ctx context.Context, root, dir string, env []string, flags ...string) (string, error) {
	bin := filepath.Join(dir, "sluice")
	args := append(append([]string{"build"}, flags...), "-o", bin, "./cmd/sluice")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("servetest: go %s in %s: %w\n%s", strings.Join(args, " "), root, err, out)
	}
	return bin, nil
}

// Options are how Start runs a process. The zero value runs it in the
// current directory, its log kept in memory only, waiting a minute.
type Options struct {
	// Dir is the process's working directory. Default: the current one.
	Dir string
	// LogPath, when set, is a file that receives the process's whole
	// stderr as well, so a panic it printed can be read afterwards.
	LogPath string
	// Timeout bounds the wait for the check API's address. Default: 1m.
	Timeout time.Duration
}

// The lines that name the addresses sluice serve listens on, in its text
// or JSON log format.
var (
	apiLine   = regexp.MustCompile(`msg=listening addr=(https?://\S+)|"msg":"listening","addr":"(https?://[^"]+)"`)
	proxyLine = regexp.MustCompile(`msg="proxy listening" addr=(\S+)|"msg":"proxy listening","addr":"([^"]+)"`)
	rlsLine   = regexp.MustCompile(`msg="envoy rate-limit service listening" addr=(\S+)|"msg":"envoy rate-limit service listening","addr":"([^"]+)"`)
)

// Process is a sluice process this package started. Its addresses are
// read from its log lines; its stderr is kept (Logs).
type Process struct {
	// URL is the check API's base URL, e.g. http://127.0.0.1:41234.
	URL string
	// StartLine is the log line that named URL.
	StartLine string

	cmd     *exec.Cmd
	mu      sync.Mutex // guards log, proxy and rls
	log     bytes.Buffer
	proxy   string
	rls     string
	exited  chan struct{}
	waitErr error // once exited is closed
	stop    sync.Once
	stopErr error
}

// Start runs bin with args (serve -c FILE …) and waits until it logs the
// address of its check API, exits, or o.Timeout passes; on the last two
// it stops the process and returns an error with its log. The caller
// must Stop it.
func Start(bin string, o Options, args ...string) (*Process, error) {
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	p := &Process{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.cmd.Dir = o.Dir
	var logFile *os.File
	if o.LogPath != "" {
		f, err := os.Create(o.LogPath)
		if err != nil {
			return nil, fmt.Errorf("servetest: %w", err)
		}
		logFile = f
	}
	stderr, err := p.cmd.StderrPipe()
	if err == nil {
		err = p.cmd.Start()
	}
	if err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("servetest: start %s: %w", bin, err)
	}
	ready := make(chan struct{})
	go p.read(stderr, logFile, ready)
	select {
	case <-ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("servetest: sluice %s exited before listening: %v\n%s", strings.Join(args, " "), p.waitErr, p.Logs())
	case <-time.After(o.Timeout):
	}
	p.Stop(5 * time.Second)
	return nil, fmt.Errorf("servetest: sluice %s did not listen within %v:\n%s", strings.Join(args, " "), o.Timeout, p.Logs())
}

// read keeps every line of the process's stderr (and writes it to
// logFile), notes the addresses, closes ready at the check API's, and
// closes p.exited once the process has exited.
func (p *Process) read(stderr io.Reader, logFile *os.File, ready chan struct{}) {
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if logFile != nil {
			fmt.Fprintln(logFile, line)
		}
		p.mu.Lock()
		p.log.WriteString(line + "\n")
		if m := proxyLine.FindStringSubmatch(line); m != nil {
			p.proxy = m[1] + m[2]
		}
		if m := rlsLine.FindStringSubmatch(line); m != nil {
			p.rls = m[1] + m[2]
		}
		if m := apiLine.FindStringSubmatch(line); m != nil && p.URL == "" {
			p.URL, p.StartLine = m[1]+m[2], line
			close(ready)
		}
		p.mu.Unlock()
	}
	if logFile != nil {
		io.Copy(logFile, stderr) // a line too long for the scanner: keep the rest
		logFile.Close()
	}
	p.waitErr = p.cmd.Wait()
	close(p.exited)
}

// Logs returns what the process has written on stderr so far.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// ProxyURL is the proxy's base URL, "" without a proxy section.
func (p *Process) ProxyURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proxy
}

// RLSAddr is the Envoy rate-limit service's host:port, "" without an
// envoy section.
func (p *Process) RLSAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rls
}

// PID is the process's id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (SIGHUP reloads sluice serve).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Exited is closed once the process has exited; Err says how.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is the process's exit error (nil for status 0), once Exited is
// closed.
func (p *Process) Err() error {
	<-p.exited
	return p.waitErr
}

// Stop sends SIGTERM and waits for the process to exit, at most grace
// before SIGKILL, and for its log to be read. It returns the exit error,
// or one that says it was killed. Later calls return what the first did.
func (p *Process) Stop(grace time.Duration) error {
	p.stop.Do(func() {
		select {
		case <-p.exited:
			p.stopErr = p.waitErr
			return
		default:
		}
		p.cmd.Process.Signal(syscall.SIGTERM) // this package's own child, by PID
		select {
		case <-p.exited:
			p.stopErr = p.waitErr
		case <-time.After(grace):
			p.cmd.Process.Kill()
			<-p.exited
			p.stopErr = fmt.Errorf("servetest: sluice (pid %d) did not stop within %v of SIGTERM: killed", p.PID(), grace)
		}
	})
	return p.stopErr
}
