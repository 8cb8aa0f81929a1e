package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// callgrind counts the instructions a redis-server started under
// valgrind's callgrind (with instrumentation off at start, as
// ../shared/tools/rediscg start does it) spends on a cell's measured phase
// only: zeroed and switched on before, switched off and dumped after.
// Instructions in user space are the same on any machine for the same
// binaries and the same batching, where CPU time is not.
type callgrind struct {
	pid int
	dir string // where the server's dumps go: cg.<pid>, cg.<pid>.1, …
}

// newCallgrind finds the dump directory of the server with pid the way
// rediscg does: the symlink $TMPDIR/rediscg.<pid> (default /tmp).
func newCallgrind(pid int) (*callgrind, error) {
	if _, err := exec.LookPath("callgrind_control"); err != nil {
		return nil, fmt.Errorf("-callgrind-pid: callgrind_control not found (install valgrind): %w", err)
	}
	tmp := os.Getenv("TMPDIR")
	if tmp == "" {
		tmp = "/tmp"
	}
	link := filepath.Join(tmp, "rediscg."+strconv.Itoa(pid))
	dir, err := filepath.EvalSymlinks(link)
	if err != nil {
		return nil, fmt.Errorf("-callgrind-pid %d: no dump directory %s (start the server with rediscg start PORT): %w", pid, link, err)
	}
	return &callgrind{pid: pid, dir: dir}, nil
}

func (c *callgrind) control(args ...string) error {
	args = append(args, strconv.Itoa(c.pid))
	out, err := exec.Command("callgrind_control", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// start zeroes the counters and switches instrumentation on.
func (c *callgrind) start() error {
	if err := c.control("-z"); err != nil {
		return err
	}
	return c.control("-i", "on")
}

// stop switches instrumentation off, dumps, and returns the instructions
// counted since start: the largest summary or totals line of the newest
// dump.
func (c *callgrind) stop() (int64, error) {
	if err := c.control("-i", "off"); err != nil {
		return 0, err
	}
	if err := c.control("-d"); err != nil {
		return 0, err
	}
	return newestTotal(c.dir)
}

// newestTotal reads the instruction total of the newest cg.* dump in dir.
func newestTotal(dir string) (int64, error) {
	dumps, err := filepath.Glob(filepath.Join(dir, "cg.*"))
	if err != nil || len(dumps) == 0 {
		return 0, fmt.Errorf("no callgrind dump in %s", dir)
	}
	newest, newestTime := "", int64(0)
	for _, d := range dumps {
		fi, err := os.Stat(d)
		if err != nil {
			continue
		}
		if t := fi.ModTime().UnixNano(); newest == "" || t > newestTime {
			newest, newestTime = d, t
		}
	}
	f, err := os.Open(newest)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "summary:")
		if !ok {
			rest, ok = strings.CutPrefix(line, "totals:")
		}
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", newest, line, err)
		}
		total, found = max(total, n), true
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", newest, err)
	}
	if !found {
		return 0, fmt.Errorf("%s: no summary or totals line", newest)
	}
	return total, nil
}
