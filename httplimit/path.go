package httplimit

import (
	"net/http"
	"path"
	"strings"

	"github.com/sluicehq/sluice/internal/edge"
)

// canonicalPath is the form routes match paths in, so that no spelling a
// lenient upstream server takes for the same path dodges its route: cut
// at a NUL (C servers stop there), other control bytes dropped,
// backslashes read as slashes (IIS); lower case; each segment without
// ;parameters (Tomcat, Jetty) and without trailing dots and spaces (IIS);
// empty and dot segments resolved. Methods match whatever their case.
// "/LOGIN", "/login;jsessionid=1", "/login..;/", "/login.", `/login\`,
// `/\login` and "/login\x00.php" all match "/login". p is decoded
// (http.Request.URL.Path).
func canonicalPath(p string) string {
	if i := strings.IndexByte(p, 0); i >= 0 {
		p = p[:i]
	}
	p = strings.Map(func(r rune) rune {
		switch {
		case r == '\\':
			return '/'
		case r < 0x20 || r == 0x7f:
			return -1
		}
		return r
	}, p)
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if j := strings.IndexByte(s, ';'); j >= 0 {
			s = s[:j]
		}
		if s != "." && s != ".." {
			s = strings.TrimRight(s, ". ")
		}
		segs[i] = strings.ToLower(s)
	}
	p = strings.Join(segs, "/")
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	return path.Clean(p)
}

// hasPathPrefix reports whether p starts with the whole segments of
// prefix (which has no trailing slash).
func hasPathPrefix(p, prefix string) bool {
	return strings.HasPrefix(p, prefix) && (len(p) == len(prefix) || p[len(prefix)] == '/')
}

// normalPath returns the normal form of the escaped path p (see
// Options.StrictPaths): encoded unreserved characters decoded, other
// escapes in upper case, empty and dot segments removed (RFC 3986's
// remove_dot_segments, a trailing slash kept), e.g. "/a/%2e%2E/Login//x/"
// is "/Login/x/"; decoded is normal with every escape decoded. A path no normal form can stand for without guessing
// how a server reads it is refused: reason says what it holds, e.g. "an
// encoded slash (%2F)"; it is "" for the others. A path that does not
// start with "/" ("*") is its own normal form.
func normalPath(p string) (normal, decoded, reason string) {
	if p == "" || p[0] != '/' || isPlainPath(p) {
		return p, p, ""
	}
	raw := strings.Split(p[1:], "/")
	segs := make([]string, 0, len(raw))
	decs := make([]string, 0, len(raw))
	var enc, dec strings.Builder
	for _, s := range raw {
		enc.Reset()
		dec.Reset()
		if reason := normalSegment(s, &enc, &dec); reason != "" {
			return "", "", reason
		}
		switch d := dec.String(); {
		case d == "" || d == ".":
		case d == "..":
			if len(segs) > 0 {
				segs, decs = segs[:len(segs)-1], decs[:len(decs)-1]
			}
		case disguisedDot(d):
			return "", "", "a dot segment in disguise (such as ..; or ...)"
		default:
			segs, decs = append(segs, enc.String()), append(decs, d)
		}
	}
	normal, decoded = "/"+strings.Join(segs, "/"), "/"+strings.Join(decs, "/")
	if last := raw[len(raw)-1]; len(segs) > 0 && (last == "" || last == "." || last == ".." || strings.EqualFold(last, "%2e") || strings.EqualFold(last, "%2e%2e")) {
		normal, decoded = normal+"/", decoded+"/"
	}
	return normal, decoded, ""
}

// isPlainPath reports whether p, which starts with "/", is its own normal
// form for want of anything to normalise: no escape, backslash or control
// byte, and no segment that is empty or starts with "." or ";" (where
// dot segments, disguised or not, are). Most paths are, and are then
// passed on without a copy.
func isPlainPath(p string) bool {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '%' || c == '\\' || c < 0x20 || c == 0x7f:
			return false
		case c == '/' && i+1 < len(p) && (p[i+1] == '/' || p[i+1] == '.' || p[i+1] == ';'):
			return false
		}
	}
	return true
}

// normalSegment writes segment s normalised to enc and fully decoded to
// dec, or says why it has no normal form.
func normalSegment(s string, enc, dec *strings.Builder) string {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			return "a backslash"
		case c < 0x20 || c == 0x7f:
			return "a control byte"
		case c != '%':
			enc.WriteByte(c)
			dec.WriteByte(c)
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return "a malformed %-escape"
		}
		v := unhex(s[i+1])<<4 | unhex(s[i+2])
		i += 2
		switch {
		case v == '/':
			return "an encoded slash (%2F)"
		case v == '\\':
			return "an encoded backslash (%5C)"
		case v == '#': // a raw '#' in the request line arrives as %23 too
			return "a # (%23)"
		case v < 0x20 || v == 0x7f:
			return "an encoded NUL or control byte"
		case isUnreserved(v):
			enc.WriteByte(v)
		default:
			const hex = "0123456789ABCDEF"
			enc.Write([]byte{'%', hex[v>>4], hex[v&15]})
		}
		dec.WriteByte(v)
	}
	return ""
}

// disguisedDot reports whether the decoded segment d, neither "." nor
// "..", is one a lenient server reads as a dot (or empty) segment: dots
// and spaces, maybe followed by ;parameters ("..;x", "...", ". ").
func disguisedDot(d string) bool {
	if j := strings.IndexByte(d, ';'); j >= 0 {
		d = d[:j]
	}
	return strings.TrimRight(d, ". ") == ""
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// isUnreserved reports whether c is an RFC 3986 unreserved character,
// which an escape stands for no differently than the character itself.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// strictPath returns r with its path in normal form (see
// Options.StrictPaths), or answers 400 and reports false when it has
// none.
func (m *Middleware) strictPath(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	esc := r.URL.EscapedPath()
	normal, decoded, reason := normalPath(esc)
	if reason != "" {
		edge.WriteProblem(w, edge.Problem{
			Type:   "about:blank",
			Title:  "Bad Request",
			Status: http.StatusBadRequest,
			Detail: "The request path holds " + reason + ", which servers read differently.",
		})
		return nil, false
	}
	if normal == esc {
		return r, true
	}
	u := *r.URL
	u.Path, u.RawPath = decoded, normal
	r2 := r.WithContext(r.Context())
	r2.URL = &u
	return r2, true
}
