package redisstore_test

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// testChild is a child process of a process test: the test binary run
// again with one test of its own, which says "ready" and then its
// results on lines that start with the test's mark.
type testChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ready  chan struct{}
	done   chan struct{}
	lines  []string // what it said after ready
	stderr strings.Builder
}

// testChildren are the children one process test started.
type testChildren struct {
	t    *testing.T
	list []*testChild
}

// startChildren starts n children running the test named by run (a
// -test.run pattern), child i with env(i) added to this process's
// environment, reading what each says after mark. Every child it
// started is killed, by its own handle, when the test ends.
func startChildren(t *testing.T, n int, run, mark string, env func(i int) string) *testChildren {
	t.Helper()
	cs := &testChildren{t: t, list: make([]*testChild, n)}
	for i := range cs.list {
		ch := &testChild{ready: make(chan struct{}), done: make(chan struct{})}
		cs.list[i] = ch
		ch.cmd = exec.Command(os.Args[0], "-test.run="+run, "-test.count=1")
		ch.cmd.Env = append(os.Environ(), env(i), lqGORACE())
		ch.cmd.Stderr = &ch.stderr
		var err error
		if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		stdout, err := ch.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if ch.cmd.ProcessState == nil {
				ch.cmd.Process.Kill() // a child this test started, by its own handle
				ch.cmd.Wait()
			}
		})
		go func() {
			defer close(ch.done)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 64<<10), 4<<20)
			for sc.Scan() {
				switch line, ok := strings.CutPrefix(sc.Text(), mark); {
				case !ok:
				case line == "ready":
					close(ch.ready)
				default:
					ch.lines = append(ch.lines, line)
				}
			}
		}()
	}
	return cs
}

// fail kills every child still running, by its handle, and fails the
// test with what child i did and its stderr.
func (cs *testChildren) fail(i int, what string) {
	cs.t.Helper()
	for _, ch := range cs.list {
		if ch.cmd.ProcessState == nil {
			ch.cmd.Process.Kill() // the children this test started, by their own handles
		}
	}
	cs.list[i].cmd.Wait() // its stderr is whole once it has been waited for
	cs.t.Fatalf("child %d %s; its stderr:\n%s", i, what, cs.list[i].stderr.String())
}

// waitReady waits until every child said ready, or fails.
func (cs *testChildren) waitReady(timeout <-chan time.Time) {
	cs.t.Helper()
	for i, ch := range cs.list {
		select {
		case <-ch.ready:
		case <-ch.done:
			cs.fail(i, "ended before it was ready")
		case <-timeout:
			cs.fail(i, "was not ready in time")
		}
	}
}

// tell writes line i (with its newline) to child i's stdin, or fails.
func (cs *testChildren) tell(line func(i int) string) {
	cs.t.Helper()
	for i, ch := range cs.list {
		if _, err := io.WriteString(ch.stdin, line(i)+"\n"); err != nil {
			cs.fail(i, "took no "+line(i)+": "+err.Error())
		}
	}
}

// waitDone waits until every child ended well having said something, or
// fails.
func (cs *testChildren) waitDone(timeout <-chan time.Time) {
	cs.t.Helper()
	for i, ch := range cs.list {
		select {
		case <-ch.done:
		case <-timeout:
			cs.fail(i, "did not stop by itself")
		}
		if err := ch.cmd.Wait(); err != nil {
			cs.fail(i, "failed: "+err.Error())
		}
		if len(ch.lines) == 0 {
			cs.fail(i, "said nothing")
		}
	}
}
