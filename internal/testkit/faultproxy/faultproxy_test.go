package faultproxy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/faultproxy"
)

// upstream is an echo server that keeps what it received, per connection.
type upstream struct {
	l   net.Listener
	mu  sync.Mutex
	got []*bytes.Buffer
	wg  sync.WaitGroup
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{l: l}
	u.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b := new(bytes.Buffer)
			u.mu.Lock()
			u.got = append(u.got, b)
			u.mu.Unlock()
			u.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					u.mu.Lock()
					b.Write(buf[:n])
					u.mu.Unlock()
					if n > 0 {
						c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() { l.Close(); u.wg.Wait() })
	return u
}

// received returns what connection i received so far.
func (u *upstream) received(i int) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if i >= len(u.got) {
		return ""
	}
	return u.got[i].String()
}

func start(t *testing.T) (*faultproxy.Proxy, *upstream) {
	t.Helper()
	u := newUpstream(t)
	p, err := faultproxy.New(u.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, u
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads len(msg) bytes back within wait.
func roundTrip(c net.Conn, msg string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, len(msg))
	n, err := io.ReadFull(c, buf)
	return string(buf[:n]), err
}

// eventually waits, a bounded number of times, for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within 5s", what)
}

func TestForward(t *testing.T) {
	p, _ := start(t)
	c := dial(t, p)
	for _, msg := range []string{"hello", "world"} {
		if got, err := roundTrip(c, msg, 10*time.Second); got != msg || err != nil {
			t.Fatalf("round trip of %q = %q, %v", msg, got, err)
		}
	}
}

func TestLatency(t *testing.T) {
	p, _ := start(t)
	c := dial(t, p)
	const d = 100 * time.Millisecond
	p.SetLatency(d)
	if got, err := roundTrip(c, "slow", 10*time.Second); got != "slow" || err != nil {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	// Each direction waited d out: two chunks delayed, one each way.
	if n := p.Delayed(); n != 2 {
		t.Fatalf("round trip with %v latency each way: %d chunks delayed, want 2", d, n)
	}
	p.SetLatency(0)
	if got, err := roundTrip(c, "fast", 10*time.Second); got != "fast" || err != nil {
		t.Fatalf("round trip after latency cleared = %q, %v", got, err)
	}
	if n := p.Delayed(); n != 2 {
		t.Fatalf("round trip after latency cleared: %d chunks delayed in all, want still 2", n)
	}
}

func TestHang(t *testing.T) {
	p, u := start(t)
	c := dial(t, p)
	if _, err := roundTrip(c, "up", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Hang()
	var ne net.Error
	if got, err := roundTrip(c, "held", 200*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("round trip while hung = %q, %v; want a read timeout", got, err)
	}
	if got := u.received(0); got != "up" {
		t.Fatalf("upstream received %q while hung, want only %q", got, "up")
	}
	// A new connection is accepted and hangs too.
	c2 := dial(t, p)
	if got, err := roundTrip(c2, "new", 200*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("round trip on a new connection while hung = %q, %v; want a read timeout", got, err)
	}
	p.Forward()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after Forward, the held bytes = %q, %v; want %q", buf, err, "held")
	}
}

func TestResetAfter(t *testing.T) {
	p, u := start(t)
	c := dial(t, p)
	if _, err := roundTrip(c, "ok", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.ResetAfter(3)
	got, err := roundTrip(c, "hello", 10*time.Second)
	if err == nil || got != "" {
		t.Fatalf("round trip past the reset = %q, %v; want an error and nothing", got, err)
	}
	eventually(t, "upstream receives 3 bytes", func() bool { return u.received(0) == "okhel" })
	p.Forward()
	c2 := dial(t, p)
	if got, err := roundTrip(c2, "again", 10*time.Second); got != "again" || err != nil {
		t.Fatalf("round trip on a new connection after Forward = %q, %v", got, err)
	}
}

func TestResetOnReply(t *testing.T) {
	p, u := start(t)
	c := dial(t, p)
	if _, err := roundTrip(c, "ok", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.ResetOnReply()
	got, err := roundTrip(c, "cmd", 10*time.Second)
	if err == nil || got != "" {
		t.Fatalf("round trip with its reply reset = %q, %v; want an error and nothing", got, err)
	}
	eventually(t, "upstream receives the command", func() bool { return u.received(0) == "okcmd" })
}

func TestDrop(t *testing.T) {
	p, _ := start(t)
	c := dial(t, p)
	if _, err := roundTrip(c, "ok", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Drop()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read after Drop = %d bytes, want an error", n)
	}
	c2 := dial(t, p)
	if got, err := roundTrip(c2, "new", 10*time.Second); got != "new" || err != nil {
		t.Fatalf("round trip on a new connection after Drop = %q, %v", got, err)
	}
}

// TestConcurrentAndClose: clients talk while faults change under them;
// Close then stops every goroutine the proxy started, held bytes included.
func TestConcurrentAndClose(t *testing.T) {
	u := newUpstream(t)
	before := runtime.NumGoroutine()
	p, err := faultproxy.New(u.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				return
			}
			defer c.Close()
			for range 20 {
				if _, err := roundTrip(c, "x", 50*time.Millisecond); err != nil && !isTimeout(err) {
					return
				}
			}
		})
	}
	for i := range 20 {
		switch i % 4 {
		case 0:
			p.SetLatency(time.Millisecond)
		case 1:
			p.Hang()
		case 2:
			p.Forward()
		case 3:
			p.Drop()
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Hang() // bytes held when Close comes
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded, want refused")
	}
	eventually(t, "goroutines back to where they were", func() bool { return runtime.NumGoroutine() <= before })
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
