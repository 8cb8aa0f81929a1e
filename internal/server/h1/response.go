package h1

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// response is the http.ResponseWriter of a request served here: it
// gathers the answer, which answer writes in one piece.
type response struct {
	h     http.Header
	code  int
	wrote bool
	out   []byte // the status line and header fields, once written
	body  []byte
	keys  []string

	hasDate, hasLength, hasType, hasEncoding, close bool
	ending                                          bool // the listener is shutting down
}

func (w *response) Header() http.Header { return w.h }

// WriteHeader writes the status line and the header fields as they are
// now, as net/http's does: later changes to Header are not sent.
func (w *response) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.wrote {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// An informational answer goes before the final one.
		w.out = appendStatus(w.out, code)
		w.out = w.appendFields(w.out, code)
		w.out = append(w.out, "\r\n"...)
		return
	}
	w.wrote, w.code = true, code
	w.out = appendStatus(w.out, code)
	w.out = w.appendFields(w.out, code)
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.code) {
		return 0, http.ErrBodyNotAllowed
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// finish ends the answer with the fields net/http adds (Date,
// Content-Length, a sniffed Content-Type, Connection: close while
// shutting down) and the body.
func (w *response) finish() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	allowed := bodyAllowed(w.code)
	if !w.hasDate {
		w.out = append(w.out, "Date: "...)
		w.out = time.Now().UTC().AppendFormat(w.out, http.TimeFormat)
		w.out = append(w.out, "\r\n"...)
	}
	if allowed && !w.hasLength {
		w.out = append(w.out, "Content-Length: "...)
		w.out = strconv.AppendInt(w.out, int64(len(w.body)), 10)
		w.out = append(w.out, "\r\n"...)
	}
	if allowed && !w.hasType && !w.hasEncoding && len(w.body) > 0 {
		w.out = append(w.out, "Content-Type: "...)
		w.out = append(w.out, http.DetectContentType(w.body)...)
		w.out = append(w.out, "\r\n"...)
	}
	if w.ending && !w.close {
		// The server is shutting down: the connection closes after
		// this answer, and says so, as net/http's.
		w.out = append(w.out, "Connection: close\r\n"...)
		w.close = true
	}
	w.out = append(w.out, "\r\n"...)
	if allowed {
		w.out = append(w.out, w.body...)
	}
}

// appendStatus appends the status line of code, as net/http writes it.
func appendStatus(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	if text := http.StatusText(code); text != "" {
		b = strconv.AppendInt(b, int64(code), 10)
		b = append(b, ' ')
		b = append(b, text...)
		return append(b, "\r\n"...)
	}
	return fmt.Appendf(b, "%03d status code %d\r\n", code, code)
}

// appendFields appends the handler's header fields sorted by name, as
// net/http's Header.WriteSubset writes them, leaving out those net/http
// leaves out for code, and notes the fields that decide what finish
// adds.
func (w *response) appendFields(b []byte, code int) []byte {
	w.keys = w.keys[:0]
	for k := range w.h {
		w.keys = append(w.keys, k)
	}
	slices.Sort(w.keys)
	for _, k := range w.keys {
		vs := w.h[k]
		switch k {
		case "Date":
			w.hasDate = true
		case "Content-Length":
			w.hasLength = true
		case "Content-Type":
			w.hasType = true // set, even empty, it is not sniffed
		case "Content-Encoding":
			w.hasEncoding = len(vs) > 0 && vs[0] != ""
		case "Connection":
			w.close = len(vs) > 0 && vs[0] == "close"
		}
		if !validFieldName(k) || strings.HasPrefix(k, http.TrailerPrefix) || k == "Transfer-Encoding" || k == "Trailer" || suppressed(code, k) {
			continue
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// appendValue appends v with CR and LF made spaces and then trimmed of
// ASCII blanks at either end, as net/http writes a field's value.
func appendValue(b []byte, v string) []byte {
	if plainValue(v) {
		return append(b, v...)
	}
	i, j := 0, len(v)
	blank := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for i < j && blank(v[i]) {
		i++
	}
	for j > i && blank(v[j-1]) {
		j--
	}
	for k := i; k < j; k++ {
		c := v[k]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return b
}

// plainValue reports whether v is written as it is: no CR or LF, no
// blank at either end.
func plainValue(v string) bool {
	if v == "" {
		return true
	}
	if c := v[0]; c == ' ' || c == '\t' {
		return false
	}
	if c := v[len(v)-1]; c == ' ' || c == '\t' {
		return false
	}
	return strings.IndexByte(v, '\r') < 0 && strings.IndexByte(v, '\n') < 0
}

func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !isTokenByte(k[i]) {
			return false
		}
	}
	return true
}

// bodyAllowed reports whether an answer of code has a body.
func bodyAllowed(code int) bool {
	return (code < 100 || code > 199) && code != http.StatusNoContent && code != http.StatusNotModified
}

// suppressed reports whether net/http leaves field k out of an answer
// of code.
func suppressed(code int, k string) bool {
	switch {
	case code == http.StatusNotModified:
		return k == "Content-Type" || k == "Content-Length"
	case !bodyAllowed(code):
		return k == "Content-Length"
	}
	return false
}

// answer runs the handler on r and writes its answer: whether the
// connection may serve another request.
func (c *conn) answer(r *http.Request) bool {
	w := &c.w
	if w.h == nil {
		w.h = make(http.Header, 8)
	}
	clear(w.h)
	*w = response{h: w.h, out: c.out[:0], body: w.body[:0], keys: w.keys}
	h := c.l.srv.Handler
	if h == nil {
		h = http.DefaultServeMux
	}
	h.ServeHTTP(w, r)
	w.ending = c.l.closing.Load()
	w.finish()
	c.out = w.out
	c.deadline(true, c.l.srv.WriteTimeout)
	if _, err := c.c.Write(w.out); err != nil {
		return false
	}
	if cap(c.out) > 4*bufSize { // one large answer does not stay
		c.out, w.body = nil, nil
	}
	return !w.close
}
