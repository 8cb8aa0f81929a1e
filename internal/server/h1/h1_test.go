package h1

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strings"
	"testing"
	"time"
)

// seen is what a handler saw of a request, and who served it.
type seen struct {
	fast                 bool // served here, not by net/http
	method, path, host   string
	header               http.Header
	contentLength        int64
	body                 string
	remoteAddr, proto    string
	requestURI, rawQuery string
}

// handlers answer as the check API and a few odd handlers do; the path's
// last segment picks one.
func handler(saw chan<- seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if saw != nil {
			saw <- seen{
				fast: r.Context().Value(http.ServerContextKey) == nil, method: r.Method, path: r.URL.Path, host: r.Host,
				header: r.Header.Clone(), contentLength: r.ContentLength, body: string(b),
				remoteAddr: r.RemoteAddr, proto: r.Proto, requestURI: r.RequestURI, rawQuery: r.URL.RawQuery,
			}
		}
		h := w.Header()
		switch r.Header.Get("X-Answer") {
		case "check":
			h["Content-Type"] = []string{"application/json"}
			h["Cache-Control"] = []string{"no-store"}
			h["Date"] = []string{"Sat, 05 Dec 2026 21:00:00 GMT"}
			h["Ratelimit-Policy"] = []string{`"open";q=100;w=1`}
			h["Ratelimit"] = []string{`"open";r=99;t=0`}
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(`{"allowed":true,"remaining":99}`))
		case "denied":
			h.Set("Retry-After", "3")
			h.Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"allowed":false}`))
		case "sniff":
			w.Write([]byte("<html><body>hi</body></html>"))
		case "empty":
		case "nocontent":
			h.Set("Content-Type", "text/plain")
			h.Set("Content-Length", "0")
			w.WriteHeader(http.StatusNoContent)
		case "notmodified":
			h.Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusNotModified)
		case "odd":
			h["X-Multi"] = []string{"a", " b\r\nc "}
			h["Bad Name"] = []string{"dropped"}
			h["X-Empty"] = []string{""}
			h["Content-Type"] = nil
			w.WriteHeader(599)
			w.WriteHeader(200) // superfluous
			h.Set("X-Late", "not sent")
			w.Write([]byte("x"))
		case "close":
			h.Set("Connection", "close")
			w.Write([]byte("bye"))
		default:
			fmt.Fprintf(w, "path %s", r.URL.Path)
		}
	})
}

// serveBoth starts the handler behind net/http alone and behind a
// Listener routing POST /v1/check: their addresses.
func serveBoth(t *testing.T, saw chan<- seen) (plain, fast string, l *Listener) {
	t.Helper()
	newSrv := func() *http.Server {
		return &http.Server{Handler: handler(saw), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	}
	ln1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s1, s2 := newSrv(), newSrv()
	l = New(ln2, s2, Route{Method: http.MethodPost, Path: "/v1/check"})
	go s1.Serve(ln1)
	go s2.Serve(l)
	t.Cleanup(func() {
		s1.Close()
		s2.Close()
		l.Shutdown(context.Background())
	})
	return ln1.Addr().String(), l.Addr().String(), l
}

// roundTrips writes raw to addr on one connection and reads n answers.
func roundTrips(t *testing.T, addr, raw string, n int) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []string
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d of %q: %v", len(out)+1, raw, err)
		}
		b, err := httputil.DumpResponse(resp, true)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

// rawAnswer writes raw to addr and reads the connection until the
// answer's end (its Content-Length) or the connection's: the bytes as
// sent.
func rawAnswer(t *testing.T, addr, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, raw)
	var got []byte
	buf := make([]byte, 4096)
	from := 0 // where the final answer begins: after any 1xx
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		for {
			i := bytes.Index(got[from:], []byte("\r\n\r\n"))
			if i < 0 || !bytes.HasPrefix(got[from:], []byte("HTTP/1.1 1")) {
				break
			}
			from += i + 4
		}
		if i := bytes.Index(got[from:], []byte("\r\n\r\n")); i >= 0 {
			m := regexp.MustCompile(`(?m)^Content-Length: (\d+)\r$`).FindSubmatch(got[from : from+i+2])
			want := 0
			if m != nil {
				fmt.Sscan(string(m[1]), &want)
			}
			if len(got) >= from+i+4+want {
				return string(got)
			}
		}
		if err != nil {
			return string(got)
		}
	}
}

var dateLine = regexp.MustCompile(`Date: [^\r]*\r\n`)

func req(answer, body string) string {
	return "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: " +
		fmt.Sprint(len(body)) + "\r\nContent-Type: application/json\r\nX-Answer: " + answer + "\r\n\r\n" + body
}

// TestSameAnswerAsNetHTTP holds the answers of requests served here to
// net/http's, byte for byte (the Date net/http adds aside), and the
// request the handler sees to net/http's.
func TestSameAnswerAsNetHTTP(t *testing.T) {
	saw := make(chan seen, 2)
	plain, fast, _ := serveBoth(t, saw)
	for _, answer := range []string{"check", "denied", "sniff", "empty", "nocontent", "notmodified", "odd", "close", "default"} {
		raw := req(answer, `{"policy":"open","subject":"alice"}`)
		want := rawAnswer(t, plain, raw)
		viaNet := <-saw
		got := rawAnswer(t, fast, raw)
		viaH1 := <-saw
		if viaNet.fast || !viaH1.fast {
			t.Fatalf("%s: served fast by net/http %v, by the Listener %v; want false, true", answer, viaNet.fast, viaH1.fast)
		}
		if answer != "check" {
			want, got = dateLine.ReplaceAllString(want, "Date: -\r\n"), dateLine.ReplaceAllString(got, "Date: -\r\n")
		}
		if got != want {
			t.Errorf("%s: answer\n%q\nwant net/http's\n%q", answer, got, want)
		}
		viaNet.fast, viaH1.fast = false, false
		viaNet.remoteAddr, viaH1.remoteAddr = "", ""
		if fmt.Sprint(viaH1) != fmt.Sprint(viaNet) {
			t.Errorf("%s: the handler saw\n%+v\nwant net/http's\n%+v", answer, viaH1, viaNet)
		}
	}
}

// TestHandsOff holds every request of another shape to net/http's
// answer, and a connection handed over to net/http after requests
// served here.
func TestHandsOff(t *testing.T) {
	saw := make(chan seen, 8)
	plain, fast, _ := serveBoth(t, saw)
	big := strings.Repeat("x", 5000)
	for _, c := range []struct{ name, raw string }{
		{"another path", "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"a query", "POST /v1/check?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"},
		{"chunked", "POST /v1/check HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"},
		{"HTTP/1.0", "POST /v1/check HTTP/1.0\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"},
		{"Connection: close", "POST /v1/check HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"},
		{"a repeated field", "POST /v1/check HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nX-A: 2\r\nContent-Length: 2\r\n\r\n{}"},
		{"bare LF", "POST /v1/check HTTP/1.1\nHost: a\nContent-Length: 2\n\n{}"},
		{"no Host", "POST /v1/check HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"},
		{"no Content-Length", "POST /v1/check HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"a body past the buffer", "POST /v1/check HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n" + big},
		{"a space before the colon", "POST /v1/check HTTP/1.1\r\nHost : a\r\nContent-Length: 2\r\n\r\n{}"},
		{"Expect", "POST /v1/check HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}"},
		{"a lowercase method", "post /v1/check HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"},
	} {
		want := dateLine.ReplaceAllString(rawAnswer(t, plain, c.raw), "")
		drain(saw)
		got := dateLine.ReplaceAllString(rawAnswer(t, fast, c.raw), "")
		for _, s := range drain(saw) {
			if s.fast {
				t.Errorf("%s: served by the Listener, want net/http", c.name)
			}
		}
		if got != want {
			t.Errorf("%s: answer\n%q\nwant net/http's\n%q", c.name, got, want)
		}
	}
	// Two checks served here, then a request for net/http on the same
	// connection, pipelined.
	raw := req("check", "{}") + req("check", "{}") + "GET /other HTTP/1.1\r\nHost: a\r\n\r\n"
	got := roundTrips(t, fast, raw, 3)
	if !strings.Contains(got[2], "path /other") {
		t.Errorf("third answer %q, want net/http's answer to GET /other", got[2])
	}
	var fasts []bool
	for _, s := range drain(saw) {
		fasts = append(fasts, s.fast)
	}
	if fmt.Sprint(fasts) != "[true true false]" {
		t.Errorf("served by the Listener: %v, want [true true false]", fasts)
	}
}

// drain returns what saw holds now.
func drain(saw <-chan seen) []seen {
	var out []seen
	for {
		select {
		case s := <-saw:
			out = append(out, s)
		default:
			return out
		}
	}
}

// TestShutdown holds Shutdown to closing an idle connection, letting a
// request in flight be answered, and returning once it has.
func TestShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Wait") != "" {
			close(entered)
			<-release
		}
		w.Write([]byte("ok"))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, srv, Route{Method: http.MethodPost, Path: "/v1/check"})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	idle, idleR := dial()
	io.WriteString(idle, req("x", "{}"))
	resp, err := http.ReadResponse(idleR, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first check: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	busy, busyR := dial()
	io.WriteString(busy, strings.Replace(req("x", "{}"), "\r\n\r\n", "\r\nX-Wait: 1\r\n\r\n", 1))
	<-entered
	down := make(chan error, 1)
	go func() {
		srv.Shutdown(context.Background())
		down <- l.Shutdown(context.Background())
	}()
	if _, err := idleR.ReadByte(); err != io.EOF {
		t.Errorf("idle connection after Shutdown: read %v, want io.EOF", err)
	}
	close(release)
	resp, err = http.ReadResponse(busyR, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("check in flight: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if !resp.Close {
		t.Errorf("the answer of the check in flight at Shutdown has no Connection: close")
	}
	if _, err := busyR.ReadByte(); err != io.EOF {
		t.Errorf("busy connection after its answer: read %v, want io.EOF", err)
	}
	if err := <-down; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Errorf("Serve = %v, want http.ErrServerClosed", err)
	}
}

// FuzzParseHead holds every request parseHead accepts to net/http's
// reading of the same bytes: the same method, path, Host, length and
// fields.
func FuzzParseHead(f *testing.F) {
	f.Add([]byte(req("check", `{"policy":"a","subject":"b"}`)))
	f.Add([]byte("POST /v1/check HTTP/1.1\r\nhost: a:1\r\ncontent-length: 0\r\nx-y:  z \r\n\r\n"))
	f.Add([]byte("POST /v1/check HTTP/1.1\r\nHost: a\r\nContent-Length: 02\r\nConnection: Keep-Alive\r\n\r\n{}"))
	l := &Listener{routes: []route{{line: []byte("POST /v1/check HTTP/1.1\r\n"), method: "POST", path: "/v1/check"}}}
	f.Fuzz(func(t *testing.T, b []byte) {
		head, rt, ok := l.parseHead(b)
		if !ok || head == 0 {
			return
		}
		want, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			t.Fatalf("parseHead accepted %q, net/http: %v", b, err)
		}
		n := head + int(rt.contentLength)
		if len(b) < n {
			return
		}
		c := &conn{l: l}
		got := c.request(b[:n], head, rt)
		if got.Method != want.Method || got.URL.String() != want.URL.String() || got.Host != want.Host ||
			got.ContentLength != want.ContentLength || fmt.Sprint(got.Header) != fmt.Sprint(want.Header) {
			t.Fatalf("%q:\nparsed %s %s host %q length %d %v\nnet/http %s %s host %q length %d %v", b,
				got.Method, got.URL, got.Host, got.ContentLength, got.Header,
				want.Method, want.URL, want.Host, want.ContentLength, want.Header)
		}
		gb, _ := io.ReadAll(got.Body)
		wb, _ := io.ReadAll(want.Body)
		if !bytes.Equal(gb, wb) {
			t.Fatalf("%q: body %q, net/http's %q", b, gb, wb)
		}
	})
}

// TestTimeouts holds a connection served here to the server's idle
// timeout between requests and its header timeout within one: each
// ends the connection.
func TestTimeouts(t *testing.T) {
	srv := &http.Server{Handler: handler(nil), IdleTimeout: 50 * time.Millisecond, ReadHeaderTimeout: 50 * time.Millisecond}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, srv, Route{Method: http.MethodPost, Path: "/v1/check"})
	go srv.Serve(l)
	defer func() { srv.Close(); l.Shutdown(context.Background()) }()
	for _, c := range []struct{ name, first, then string }{
		{"idle after a check", req("check", "{}"), ""},
		{"a header that stops half way", "", "POST /v1/check HTTP/1.1\r\nHost: a\r\n"},
	} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second)) // the test's bound, far past the server's
		br := bufio.NewReader(conn)
		if c.first != "" {
			io.WriteString(conn, c.first)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			io.Copy(io.Discard, resp.Body)
		}
		io.WriteString(conn, c.then)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s: read %v, want io.EOF (the server closed the connection)", c.name, err)
		}
		conn.Close()
	}
}
