package httplimit

import (
	"strings"
	"testing"
)

func TestHasPathPrefix(t *testing.T) {
	for _, tt := range []struct {
		path, prefix string
		want         bool
	}{
		{"/api", "/api", true},
		{"/api/users", "/api", true},
		{"/apikeys", "/api", false},
		{"/", "/api", false},
		{"/v1/api", "/api", false},
	} {
		if got := hasPathPrefix(tt.path, tt.prefix); got != tt.want {
			t.Errorf("hasPathPrefix(%q, %q) = %v, want %v", tt.path, tt.prefix, got, tt.want)
		}
	}
}

func TestCanonicalPath(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/login", "/login"},
		{"/LOGIN/", "/login"},
		{"/login;jsessionid=1", "/login"},
		{"/login..;/", "/login"},
		{"/login.", "/login"},
		{`/login\`, "/login"},
		{`/\login`, "/login"},
		{`\login`, "/login"},
		{"/login\x00.php", "/login"},
		{"/lo\tgin\r\n", "/login"},
		{"/a/../login", "/login"},
		{"//login//x", "/login/x"},
		{"", "/"},
	} {
		if got := canonicalPath(tt.in); got != tt.want {
			t.Errorf("canonicalPath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestNormalPath(t *testing.T) {
	for _, tt := range []struct {
		in, normal, decoded, reason string
	}{
		{"/login", "/login", "/login", ""},
		{"/", "/", "/", ""},
		{"*", "*", "*", ""},
		{"//login//x/", "/login/x/", "/login/x/", ""},
		{"/a/./b/../c", "/a/c", "/a/c", ""},
		{"/a/b/..", "/a/", "/a/", ""},
		{"/a/b/%2E%2e", "/a/", "/a/", ""},
		{"/..", "/", "/", ""},
		{"/../../x", "/x", "/x", ""},
		{"/%2E%2E/login", "/login", "/login", ""},
		{"/x/.%2e/login", "/login", "/login", ""},
		{"/%6cogin%7E", "/login~", "/login~", ""},
		{"/caf%c3%a9", "/caf%C3%A9", "/café", ""},
		{"/a%20b", "/a%20b", "/a b", ""},
		{"/a%3Bb", "/a%3Bb", "/a;b", ""},
		{"/login..;/", "/login..;/", "/login..;/", ""},
		{`/login\`, "", "", "a backslash"},
		{"/login%5c", "", "", "an encoded backslash (%5C)"},
		{"/login%2f", "", "", "an encoded slash (%2F)"},
		{"/login%23x", "", "", "a # (%23)"},
		{"/login%00", "", "", "an encoded NUL or control byte"},
		{"/login%7f", "", "", "an encoded NUL or control byte"},
		{"/login\x01", "", "", "a control byte"},
		{"/login%", "", "", "a malformed %-escape"},
		{"/login%4", "", "", "a malformed %-escape"},
		{"/login%g0", "", "", "a malformed %-escape"},
		{"/x/..;/login", "", "", "a dot segment in disguise (such as ..; or ...)"},
		{"/x/.../login", "", "", "a dot segment in disguise (such as ..; or ...)"},
		{"/x/.%20/login", "", "", "a dot segment in disguise (such as ..; or ...)"},
		{"/x/;a/login", "", "", "a dot segment in disguise (such as ..; or ...)"},
	} {
		normal, decoded, reason := normalPath(tt.in)
		if normal != tt.normal || decoded != tt.decoded || reason != tt.reason {
			t.Errorf("normalPath(%q) = %q, %q, %q; want %q, %q, %q", tt.in, normal, decoded, reason, tt.normal, tt.decoded, tt.reason)
		}
		// A normal form is its own normal form, and matches as the
		// original does.
		if reason == "" {
			if again, _, r := normalPath(normal); again != normal || r != "" {
				t.Errorf("normalPath(%q) = %q, %q; want it unchanged", normal, again, r)
			}
			if strings.HasPrefix(tt.in, "/") && canonicalPath(decoded) != canonicalPath(tt.decoded) {
				t.Errorf("canonicalPath(%q) = %q, want %q", decoded, canonicalPath(decoded), canonicalPath(tt.decoded))
			}
		}
	}
}

// FuzzNormalPath: a normal form is its own, holds no empty or dot
// segment, and no escape a server could read as a separator.
func FuzzNormalPath(f *testing.F) {
	for _, s := range []string{"/login", "/a/../b", "/%2e%2E/x", "//x/./y/", "/caf%C3%A9", `/x\y`, "/x/..;/y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		normal, _, reason := normalPath("/" + p)
		if reason != "" {
			return
		}
		if again, _, r := normalPath(normal); again != normal || r != "" {
			t.Fatalf("normalPath(%q) = %q, then %q, %q", "/"+p, normal, again, r)
		}
		segs := strings.Split(normal[1:], "/")
		for i, s := range segs {
			if s == "." || s == ".." || (s == "" && i != len(segs)-1) {
				t.Fatalf("normalPath(%q) = %q: segment %q", "/"+p, normal, s)
			}
		}
		if strings.ContainsAny(normal, "\\\x00") || strings.Contains(strings.ToUpper(normal), "%2F") || strings.Contains(strings.ToUpper(normal), "%5C") {
			t.Fatalf("normalPath(%q) = %q", "/"+p, normal)
		}
	})
}
