package h1

import (
	"bytes"
	"net/textproto"
)

// maxFields is the most header fields of a request served here.
const maxFields = 16

// field is one header field: its canonical name and where its value is
// in the request.
type field struct {
	key    string
	v0, v1 int
}

// routeHead is what parseHead read of a request's header.
type routeHead struct {
	route         int
	fields        int // where the first field begins
	n             int
	f             [maxFields]field
	contentLength int64
	hasHost       bool
	hasLength     bool
}

// known are the field names a client sends most, canonical: a field of
// one of these names costs no allocation.
var known = [...]string{"Host", "Content-Length", "Content-Type", "User-Agent", "Accept-Encoding", "Accept", "Authorization", "Connection", "Traceparent", "Tracestate"}

// refused are the fields of requests left to net/http: they change how
// the request is framed or answered.
var refused = [...]string{"Transfer-Encoding", "Expect", "Upgrade", "Trailer", "Te", "Pragma"}

// parseHead parses the request at the start of buf: the length of its
// header (through the empty line) and its fields, with ok; head 0 with
// ok when buf holds only a beginning of a request that may still be
// served here; ok false when it is not one (net/http's).
func (l *Listener) parseHead(buf []byte) (head int, rt routeHead, ok bool) {
	rt.route = -1
	for i, r := range l.routes {
		if len(buf) < len(r.line) {
			if bytes.HasPrefix(r.line, buf) {
				return 0, rt, true
			}
			continue
		}
		if bytes.HasPrefix(buf, r.line) {
			rt.route = i
			break
		}
	}
	if rt.route < 0 {
		return 0, rt, false
	}
	pos := len(l.routes[rt.route].line)
	rt.fields = pos
	for {
		end, complete := lineEnd(buf, pos)
		if end < 0 {
			return 0, rt, complete
		}
		if end == pos { // the empty line
			if !rt.hasHost || !rt.hasLength {
				return 0, rt, false
			}
			return end + 2, rt, true
		}
		f, ok := parseField(buf[pos:end], pos)
		if !ok || !rt.take(f, buf[f.v0:f.v1]) {
			return 0, rt, false
		}
		pos = end + 2
	}
}

// lineEnd returns where the line at pos of buf ends (its CR), or -1 with
// whether buf may yet hold the line (true: it has not all arrived;
// false: a CR or LF alone, not a request served here).
func lineEnd(buf []byte, pos int) (int, bool) {
	for j := pos; j < len(buf); j++ {
		if c := buf[j]; c == '\r' {
			if j+1 == len(buf) {
				return -1, true
			}
			if buf[j+1] != '\n' {
				return -1, false
			}
			return j, true
		} else if c == '\n' {
			return -1, false
		}
	}
	return -1, true
}

// take adds field f, of value v, to rt: false when it makes the request
// one for net/http.
func (rt *routeHead) take(f field, v []byte) bool {
	if rt.n == maxFields {
		return false
	}
	for i := 0; i < rt.n; i++ {
		if rt.f[i].key == f.key {
			return false // net/http joins repeated fields
		}
	}
	switch f.key {
	case "Host":
		if !validHost(v) {
			return false
		}
		rt.hasHost = true
	case "Content-Length":
		n, ok := parseLength(v)
		if !ok || n > bufSize {
			return false
		}
		rt.contentLength, rt.hasLength = n, true
	case "Connection":
		if !bytes.EqualFold(v, []byte("keep-alive")) {
			return false
		}
	}
	for _, k := range refused {
		if f.key == k {
			return false
		}
	}
	rt.f[rt.n] = f
	rt.n++
	return true
}

// parseField parses the field line b, which begins at off in the
// request: a token name, a colon, optional blanks, a value of printable
// ASCII and tabs, optional blanks.
func parseField(b []byte, off int) (field, bool) {
	colon := bytes.IndexByte(b, ':')
	if colon <= 0 {
		return field{}, false
	}
	name := b[:colon]
	for _, c := range name {
		if !isTokenByte(c) {
			return field{}, false
		}
	}
	v0, v1 := colon+1, len(b)
	for v0 < v1 && (b[v0] == ' ' || b[v0] == '\t') {
		v0++
	}
	for v1 > v0 && (b[v1-1] == ' ' || b[v1-1] == '\t') {
		v1--
	}
	for _, c := range b[v0:v1] {
		if (c < ' ' && c != '\t') || c > '~' {
			return field{}, false
		}
	}
	key := ""
	for _, k := range known {
		if len(k) == len(name) && bytes.EqualFold(name, []byte(k)) {
			key = k
			break
		}
	}
	if key == "" {
		key = textproto.CanonicalMIMEHeaderKey(string(name))
	}
	return field{key: key, v0: off + v0, v1: off + v1}, true
}

// isTokenByte reports whether c may be in a field name (RFC 9110's
// tchar).
func isTokenByte(c byte) bool { return tchar[c] }

var tchar = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		b := byte(c)
		t[c] = 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), b) >= 0
	}
	return t
}()

// validHost reports whether v is a plain host[:port]: letters, digits,
// dots, dashes, underscores, colons and brackets.
func validHost(v []byte) bool {
	if len(v) == 0 {
		return false
	}
	for _, c := range v {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']':
		default:
			return false
		}
	}
	return true
}

// parseLength parses a Content-Length of 1 to 18 digits.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
