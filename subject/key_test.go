package subject_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/subject"
)

func TestKeyFuncs(t *testing.T) {
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	apiKey, err := subject.Header("x-api-key")
	if err != nil {
		t.Fatal(err)
	}
	user := subject.Principal(func(r *http.Request) (string, bool) {
		u := r.Header.Get("X-User")
		return u, u != ""
	})
	req := func(remote string, header ...string) *http.Request {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
		return r
	}
	tests := []struct {
		name       string
		f          subject.KeyFunc
		r          *http.Request
		kind, want string
	}{
		{"socket peer", subject.ClientIP(nil), req("203.0.113.7:4711", "X-Forwarded-For", "198.51.100.1"), "ip", "203.0.113.7/32"},
		{"behind a trusted proxy", subject.ClientIP(ips), req("10.0.0.2:4711", "X-Forwarded-For", "198.51.100.1"), "ip", "198.51.100.1/32"},
		{"unix socket", subject.ClientIP(nil), req("@"), "", ""},
		{"header", apiKey, req("203.0.113.7:1", "X-Api-Key", "k1"), "api_key", "k1"},
		{"header twice", apiKey, req("203.0.113.7:1", "X-Api-Key", "k1", "X-Api-Key", "k2"), "", ""},
		{"header absent", apiKey, req("203.0.113.7:1"), "", ""},
		{"principal", user, req("203.0.113.7:1", "X-User", "alice"), "principal", "alice"},
		{"nil principal", subject.Principal(nil), req("203.0.113.7:1", "X-User", "alice"), "", ""},
		{"first of: principal", subject.FirstOf(user, apiKey, subject.ClientIP(nil)), req("203.0.113.7:1", "X-User", "alice", "X-Api-Key", "k1"), "principal", "alice"},
		{"first of: the key", subject.FirstOf(user, nil, apiKey, subject.ClientIP(nil)), req("203.0.113.7:1", "X-Api-Key", "k1"), "api_key", "k1"},
		{"first of: the address", subject.FirstOf(user, apiKey, subject.ClientIP(nil)), req("203.0.113.7:1"), "ip", "203.0.113.7/32"},
		{"first of nothing", subject.FirstOf(), req("203.0.113.7:1"), "", ""},
	}
	for _, tt := range tests {
		if kind, id := tt.f(tt.r); kind != tt.kind || id != tt.want {
			t.Errorf("%s: (%q, %q), want (%q, %q)", tt.name, kind, id, tt.kind, tt.want)
		}
	}
	for _, name := range []string{"", "X API Key", "x-ключ"} {
		if _, err := subject.Header(name); err == nil || !strings.Contains(err.Error(), "subject: Header(") {
			t.Errorf("Header(%q) = %v, want an error naming it", name, err)
		}
	}
}
