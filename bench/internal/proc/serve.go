// Package proc reads what a user of the processes the bench programs
// measure from outside sees: resident memory from /proc/PID/status, the
// server's /metrics and the panics in its log. The processes themselves,
// `sluice serve` and redis-server, are started by the main module's
// internal/testkit (servetest, redistest), as the tests start them.
package proc

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// Panics returns the lines of a server's log file that tell of a panic:
// the runtime's "panic:" and "fatal error:", and net/http's recovered
// "http: panic serving".
func Panics(logPath string) ([]string, error) {
	b, err := os.ReadFile(logPath)
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
