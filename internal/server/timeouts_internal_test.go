package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// closedWithin bounds the wait for the server to close a connection. It
// is far above the small timeout each test sets and far below the hour
// every other timeout is set to, so that a connection held by the wrong
// timeout fails the test instead of passing late.
const closedWithin = 10 * time.Second

// TestCheckAPIIdleKeepAliveClosed: after an answered check, a keep-alive
// connection that stays silent is closed by the server once its
// IdleTimeout passes (net/http's idle timeout, nothing of its own).
func TestCheckAPIIdleKeepAliveClosed(t *testing.T) {
	addr := serveCheckAPI(t, func(s *http.Server) { s.IdleTimeout = 100 * time.Millisecond })
	c, br := dialCheckAPI(t, addr)
	body := `{"policy":"api","subject":"idle"}`
	if _, err := io.WriteString(c, "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("POST /v1/check: %s (close %v), want 200 on a connection kept alive", resp.Status, resp.Close)
	}
	if got := waitClosed(t, c, br, "an idle keep-alive connection (IdleTimeout 100ms)"); got != "" {
		t.Errorf("an idle keep-alive connection: the server sent %q before closing it, want nothing", got)
	}
}

// TestCheckAPISilentConnectionClosed: a connection that never sends a
// byte is closed by ReadHeaderTimeout, as net/http closes it; it is not
// held for the idle timeout (issue 46, point 9: the server's own HTTP/1.1
// loop held it 60 s where net/http closed it at 5).
func TestCheckAPISilentConnectionClosed(t *testing.T) {
	addr := serveCheckAPI(t, func(s *http.Server) { s.ReadHeaderTimeout = 100 * time.Millisecond })
	c, br := dialCheckAPI(t, addr)
	if got := waitClosed(t, c, br, "a silent connection (ReadHeaderTimeout 100ms)"); got != "" {
		t.Errorf("a silent connection: the server sent %q before closing it, want nothing", got)
	}
}

// TestCheckAPISlowlorisClosed: a check whose header arrives a byte at a
// time, never ending, is closed by ReadHeaderTimeout counted from its
// start: the header timer never restarts.
func TestCheckAPISlowlorisClosed(t *testing.T) {
	addr := serveCheckAPI(t, func(s *http.Server) { s.ReadHeaderTimeout = 200 * time.Millisecond })
	c, br := dialCheckAPI(t, addr)
	stop := make(chan struct{})
	dripped := make(chan struct{})
	t.Cleanup(func() { close(stop); <-dripped })
	go func() {
		defer close(dripped)
		// The plain shape of a check, then a field that never ends.
		head := []byte("POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nX-Slow: ")
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			b := byte('a')
			if i < len(head) {
				b = head[i]
			}
			if _, err := c.Write([]byte{b}); err != nil {
				return // closed
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	// net/http may answer the part it read 400 (Connection: close).
	if got := waitClosed(t, c, br, "a header sent byte by byte (ReadHeaderTimeout 200ms)"); got != "" && !strings.HasPrefix(got, "HTTP/1.1 400 ") {
		t.Errorf("a header sent byte by byte: the server sent %q before closing it, want nothing or a 400", got)
	}
}

// serveCheckAPI serves the check API as Run wires it (the built-in
// config, on a free loopback port), with every timeout of its
// http.Server an hour but those set changes, and returns its address.
func serveCheckAPI(t *testing.T, set func(*http.Server)) string {
	t.Helper()
	l, err := load("", func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	l.cfg.Server.Listen = "127.0.0.1:0"
	log := slog.New(slog.DiscardHandler)
	rn := &runner{opts: RunOptions{Log: log}.withDefaults(), log: log}
	t.Cleanup(rn.close)
	if err := rn.start(l); err != nil {
		t.Fatal(err)
	}
	if err := rn.listen(l.cfg, nil); err != nil {
		t.Fatal(err)
	}
	s := rn.https[0]
	s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout = time.Hour, time.Hour, time.Hour, time.Hour
	set(s)
	served := rn.serve()
	t.Cleanup(func() {
		if err := rn.shutdown(context.Background(), served, nil); err != nil {
			t.Error(err)
		}
	})
	return rn.lns[0].Addr().String()
}

func dialCheckAPI(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// waitClosed waits, at most closedWithin, for the server to close c (a
// read that ends in EOF or a reset) and returns what it sent before.
func waitClosed(t *testing.T, c net.Conn, br *bufio.Reader, what string) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(closedWithin))
	got, err := io.ReadAll(br)
	switch {
	case err == nil, errors.Is(err, syscall.ECONNRESET):
		return string(got)
	case isTimeout(err):
		t.Fatalf("%s: still open after %v (read %q), want it closed by the server", what, closedWithin, got)
	default:
		t.Fatalf("%s: read: %v, want EOF", what, err)
	}
	return ""
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
