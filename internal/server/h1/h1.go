// Package h1 serves the plainest HTTP/1.1 requests of a few routes itself,
// in front of a net/http server that serves everything else.
//
// A check of the check API costs its server more in net/http than in the
// handler: per request, net/http parses the header into fresh maps,
// derives a cancelable context, starts a goroutine that reads the
// connection in the background (a system call, a park and a wake-up)
// and moves the connection's deadlines three or four times. For a
// request of one of its routes, in the shape a client sends on a
// keep-alive connection, a Listener does one read and one write on the
// connection's own goroutine and runs the same http.Handler. The first
// request of any other shape or route hands the connection, with every
// byte read and not yet served, to the http.Server (Serve(l)) for good:
// net/http then answers it and everything after it, with its own
// checks and errors.
//
// The shape served here, checked byte by byte before the handler runs:
// the request line "METHOD PATH HTTP/1.1" of a route, no query; header
// fields of token names, a colon and printable ASCII values, ended by
// CRLF; one Host of host characters; one Content-Length, the whole
// request (header and body) within the 4 KiB read buffer; no
// Transfer-Encoding, Expect, Upgrade, Trailer, TE, Pragma, and
// Connection only "keep-alive"; no field repeated. Anything else goes to net/http.
//
// The answer is net/http's byte for byte (h1_test.go compares them):
// the status line, the handler's header fields sorted, then Date when
// the handler set none, Content-Length, and a sniffed Content-Type when
// the handler set none. Unlike net/http, a body longer than 2 KiB is
// still sent with its Content-Length rather than chunked, and the
// request's context is the connection's, not canceled when the client
// goes away mid-request (the handler's own deadlines bound it).
//
// Timeouts follow the http.Server's: IdleTimeout between requests,
// ReadHeaderTimeout (and ReadTimeout for the rest) once a request has
// begun but not all arrived, WriteTimeout for the answer. To save a
// system call per request, the idle and write deadlines are moved only
// once they come within a tenth of their timeout (at most a second), so
// each is honored to within that slack.
package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// bufSize is a connection's read buffer: a request must fit in it whole
// to be served here.
const bufSize = 4096

// Route is a request a Listener serves itself: its method and path.
type Route struct{ Method, Path string }

// Listener accepts the connections of an inner listener, serves the
// requests of its routes on them and hands every other connection to
// the http.Server that Serves it (Accept returns those).
type Listener struct {
	inner  net.Listener
	srv    *http.Server
	routes []route

	handoff chan net.Conn
	errs    chan error
	done    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	conns   map[*conn]struct{}
	closing atomic.Bool
	wg      sync.WaitGroup
}

type route struct {
	line         []byte // "POST /v1/check HTTP/1.1\r\n"
	method, path string
}

// New returns a Listener over inner for srv (whose Handler, timeouts and
// ErrorLog it uses; srv must then Serve the Listener), serving routes
// itself. It starts accepting at once.
func New(inner net.Listener, srv *http.Server, routes ...Route) *Listener {
	l := &Listener{
		inner: inner, srv: srv,
		handoff: make(chan net.Conn), errs: make(chan error), done: make(chan struct{}),
		conns: map[*conn]struct{}{},
	}
	for _, r := range routes {
		l.routes = append(l.routes, route{line: []byte(r.Method + " " + r.Path + " HTTP/1.1\r\n"), method: r.Method, path: r.Path})
	}
	go l.accept()
	return l
}

// accept accepts connections until the inner listener closes; an error
// goes to Accept (so net/http backs off as it does on its own
// listener's), the last one ends the loop.
func (l *Listener) accept() {
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case l.errs <- err:
			case <-l.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		fc := &conn{l: l, c: c}
		l.mu.Lock()
		if l.closing.Load() {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.conns[fc] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go fc.serve()
	}
}

// Accept returns the next connection handed to net/http, or the inner
// listener's error.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.handoff:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close closes the inner listener; connections already accepted stay
// (Shutdown ends them).
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.done)
		err = l.inner.Close()
	})
	return err
}

// Addr is the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Shutdown closes the listener and the connections between requests,
// lets those in a request answer it and close, and waits for them until
// ctx ends; then it closes the rest and returns ctx's error. The
// connections handed to net/http are the http.Server's to shut down.
func (l *Listener) Shutdown(ctx context.Context) error {
	l.Close()
	l.mu.Lock()
	l.closing.Store(true)
	for c := range l.conns {
		c.closeIfIdle()
	}
	l.mu.Unlock()
	waited := make(chan struct{})
	go func() { l.wg.Wait(); close(waited) }()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		l.mu.Lock()
		for c := range l.conns {
			c.c.Close()
		}
		l.mu.Unlock()
		<-waited
		return ctx.Err()
	}
}

// give hands c, its unread bytes in br, to net/http; false when the
// listener has closed (c is then closed).
func (l *Listener) give(c net.Conn, br *bufio.Reader) {
	c.SetDeadline(time.Time{}) // net/http sets its own
	pc := &bufferedConn{Conn: c, r: br}
	select {
	case l.handoff <- pc:
	case <-l.done:
		c.Close()
	}
}

// bufferedConn replays the bytes read ahead before the connection's.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// logf logs to the server's ErrorLog, or the standard logger.
func (l *Listener) logf(format string, args ...any) {
	if l.srv.ErrorLog != nil {
		l.srv.ErrorLog.Printf(format, args...)
	}
}

// connection states.
const (
	idle int32 = iota
	active
	closed
)

// conn is one connection served here.
type conn struct {
	l      *Listener
	c      net.Conn
	state  atomic.Int32
	remote string

	readBy, writeBy time.Time // the deadlines set, zero for none
	out             []byte
	w               response
}

func (c *conn) closeIfIdle() {
	if c.state.CompareAndSwap(idle, closed) {
		c.c.Close()
	}
}

// serve serves requests until one is not of the shape served here (then
// the connection goes to net/http), the connection fails or closes, or
// the listener shuts down.
func (c *conn) serve() {
	handed := false
	defer func() {
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			c.l.logf("http: panic serving %v: %v\n%s", c.remote, p, debug.Stack())
		}
		if !handed {
			c.c.Close()
		}
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		c.l.wg.Done()
	}()
	c.remote = c.c.RemoteAddr().String()
	br := bufio.NewReaderSize(c.c, bufSize)
	for {
		if br.Buffered() == 0 {
			idleFor := c.l.srv.IdleTimeout
			if idleFor == 0 {
				idleFor = c.l.srv.ReadTimeout // as net/http
			}
			c.deadline(false, idleFor)
		}
		if _, err := br.Peek(1); err != nil {
			return
		}
		if !c.state.CompareAndSwap(idle, active) {
			return // shut down
		}
		start := time.Now()
		req, n, ok := c.read(br, start)
		if !ok {
			if req == nil && n < 0 {
				return // the connection failed
			}
			handed = true
			c.l.give(c.c, br)
			return
		}
		keep := c.answer(req)
		br.Discard(n)
		if !keep {
			return
		}
		c.state.Store(idle)
		if c.l.closing.Load() && c.state.CompareAndSwap(idle, closed) {
			return
		}
	}
}

// deadline moves the read (or write) deadline to timeout from now when
// the one set comes within a tenth of timeout (at most a second) of now.
func (c *conn) deadline(write bool, timeout time.Duration) {
	at := &c.readBy
	if write {
		at = &c.writeBy
	}
	if timeout <= 0 {
		if !at.IsZero() {
			*at = time.Time{}
			c.set(write, *at)
		}
		return
	}
	now := time.Now()
	if !at.IsZero() && at.Sub(now) > timeout-min(timeout/10, time.Second) {
		return
	}
	*at = now.Add(timeout)
	c.set(write, *at)
}

func (c *conn) set(write bool, t time.Time) {
	if write {
		c.c.SetWriteDeadline(t)
	} else {
		c.c.SetReadDeadline(t)
	}
}

// read waits for the whole of the request that has begun in br and
// parses it: the request and its length in br when it is one to serve
// here; nil and -1 when the connection failed, nil and 0 when it is not
// (net/http's then).
func (c *conn) read(br *bufio.Reader, start time.Time) (*http.Request, int, bool) {
	timed := false
	for {
		buf, _ := br.Peek(br.Buffered())
		head, rt, ok := c.l.parseHead(buf)
		if ok && head > 0 {
			n := head + int(rt.contentLength)
			if n > bufSize {
				return nil, 0, false
			}
			if len(buf) >= n {
				return c.request(buf[:n], head, rt), n, true
			}
		} else if !ok || len(buf) == bufSize {
			return nil, 0, false
		}
		if !timed {
			timed = true
			c.readBy = time.Time{} // the idle deadline is moved again after
			by := start.Add(c.l.srv.ReadHeaderTimeout)
			if c.l.srv.ReadHeaderTimeout <= 0 || ok && head > 0 {
				by = start.Add(c.l.srv.ReadTimeout)
			}
			if by.After(start) {
				c.c.SetReadDeadline(by)
			} else {
				c.c.SetReadDeadline(time.Time{})
			}
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			if len(buf) > 0 && !isTimeout(err) && !errors.Is(err, net.ErrClosed) {
				return nil, 0, false // let net/http answer what came
			}
			return nil, -1, false
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// request builds the http.Request of the request msg, whose header is
// its first head bytes.
func (c *conn) request(msg []byte, head int, rt routeHead) *http.Request {
	hs := string(msg[rt.fields:head]) // one string for every field's value
	rr := &reqAlloc{}
	rr.url = url.URL{Path: c.l.routes[rt.route].path}
	rr.body = bodyReader{b: msg[head:]}
	h := make(http.Header, rt.n)
	strs := rr.strs[:0]
	if rt.n > len(rr.strs) {
		strs = make([]string, 0, rt.n)
	}
	host := ""
	for i := 0; i < rt.n; i++ {
		f := rt.f[i]
		v := hs[f.v0-rt.fields : f.v1-rt.fields]
		if f.key == "Host" {
			host = v
			continue
		}
		strs = append(strs, v)
		h[f.key] = strs[len(strs)-1 : len(strs) : len(strs)]
	}
	r := &rr.req
	*r = http.Request{
		Method: c.l.routes[rt.route].method,
		URL:    &rr.url, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: &rr.body, ContentLength: rt.contentLength, Host: host,
		RemoteAddr: c.remote, RequestURI: rr.url.Path,
	}
	return r
}

// reqAlloc is a request's allocations in one.
type reqAlloc struct {
	req  http.Request
	url  url.URL
	body bodyReader
	strs [8]string
}

// bodyReader reads a request's body from the read buffer.
type bodyReader struct {
	b []byte
	i int
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.i >= len(b.b) {
		return 0, io.EOF
	}
	n := copy(p, b.b[b.i:])
	b.i += n
	return n, nil
}

func (b *bodyReader) Close() error { return nil }
