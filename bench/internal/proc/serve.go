// Package proc runs the real processes the bench programs measure from
// outside: `sluice serve` built from the main module, and redis-server,
// each on a free loopback port, each ended by the PID this package started.
// It reads what a user of those processes sees: resident memory from
// /proc/PID/status and the server's /metrics.
package proc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuildSluice builds ./cmd/sluice of the main module at repo into dir and
// returns the binary's path.
func BuildSluice(ctx context.Context, repo, dir string) (string, error) {
	bin := filepath.Join(dir, "sluice")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/sluice")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/sluice in %s: %w\n%s", repo, err, out)
	}
	return bin, nil
}

// Serve is a `sluice serve` process this package started. Its whole
// stderr goes to a file, so a panic it printed can be found afterwards.
type Serve struct {
	URL     string // the check API, http://127.0.0.1:PORT
	LogPath string // the server's stderr
	cmd     *exec.Cmd
	logs    sync.WaitGroup
	log     *os.File
	stop    sync.Once
	stopErr error
}

var listening = regexp.MustCompile(`msg=listening addr=(http://\S+)`)

// StartServe runs bin serve -c config, its stderr into logPath, and waits
// (at most 30 s) for the line that names its address.
func StartServe(ctx context.Context, bin, config, logPath string) (*Serve, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "-c", config)
	pipe, err := cmd.StderrPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	s := &Serve{LogPath: logPath, cmd: cmd, log: f}
	found := make(chan string, 1)
	s.logs.Add(1)
	go func() {
		defer s.logs.Done()
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(f, sc.Text())
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
		io.Copy(f, pipe) // a line too long for the scanner: keep the rest
		close(found)
	}()
	select {
	case url, ok := <-found:
		if ok {
			s.URL = url
			return s, nil
		}
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	s.Stop()
	return nil, fmt.Errorf("sluice serve did not report its address within 30s (log: %s)", logPath)
}

// PID is the server's process id.
func (s *Serve) PID() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM to the server and waits for it, at most 15 s before
// SIGKILL, then for its log to be written out. Later calls return what
// the first did.
func (s *Serve) Stop() error {
	s.stop.Do(func() { s.stopErr = s.terminate() })
	return s.stopErr
}

func (s *Serve) terminate() error {
	err := terminate(s.cmd, 15*time.Second)
	s.logs.Wait()
	s.log.Close()
	return err
}

// terminate sends SIGTERM to cmd's process and waits for it to exit, at
// most grace before SIGKILL.
func terminate(cmd *exec.Cmd, grace time.Duration) error {
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(grace):
	}
	cmd.Process.Kill()
	<-done
	return fmt.Errorf("%s did not stop within %s of SIGTERM; killed", filepath.Base(cmd.Path), grace)
}

// Panics returns the lines of the server's log that tell of a panic: the
// runtime's "panic:" and net/http's recovered "http: panic serving".
func (s *Serve) Panics() ([]string, error) {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "panic:") || strings.Contains(line, "http: panic serving") || strings.HasPrefix(line, "fatal error:") {
			out = append(out, line)
		}
	}
	return out, nil
}

// Memory is a process's resident memory, in bytes.
type Memory struct {
	RSS  int64 // VmRSS: resident now
	Peak int64 // VmHWM: the most it was resident so far
}

// ReadMemory reads pid's VmRSS and VmHWM from /proc/PID/status.
func ReadMemory(pid int) (Memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return m, fmt.Errorf("/proc/%d/status: %q: %w", pid, line, err)
		}
		switch f[0] {
		case "VmRSS:":
			m.RSS = kb << 10
		case "VmHWM:":
			m.Peak = kb << 10
		}
	}
	if m.RSS == 0 || m.Peak == 0 {
		return m, fmt.Errorf("/proc/%d/status: no VmRSS or VmHWM", pid)
	}
	return m, nil
}

// Metrics is one scrape of /metrics: each series (name and labels, as
// exposed) and its value.
type Metrics map[string]float64

// Sum returns the sum of every series of the metric name, whatever its
// labels; ok is false when there is none.
func (m Metrics) Sum(name string) (sum float64, ok bool) {
	for series, v := range m {
		if series == name || strings.HasPrefix(series, name+"{") {
			sum += v
			ok = true
		}
	}
	return sum, ok
}

// Scrape reads base/metrics in the Prometheus text format.
func Scrape(ctx context.Context, client *http.Client, base string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain") // not the protobuf format
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	m := Metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m, sc.Err()
}

// FreePort returns a loopback port nothing listened on a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
