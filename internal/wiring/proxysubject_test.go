package wiring_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/wiring"
	"github.com/sluicehq/sluice/subject"
)

// proxyRoutes: a route by address that names its operation, one by API
// key on the match's operation.
var proxyRoutes = &config.Proxy{Routes: []config.Route{
	{Match: config.Match{PathPrefix: "/a"}, Policies: []string{"login"}, Subject: "ip", Operation: "sign-in"},
	{Match: config.Match{PathPrefix: "/b", Methods: []string{"POST"}}, Policies: []string{"login"}, Subject: "header:X-API-Key"},
}}

// TestProxySubjectIsTheProxys: the subject a plan names is the one the
// proxy's own route function (ProxyRoute) gives a request of that
// client, the route's operation included.
func TestProxySubjectIsTheProxys(t *testing.T) {
	pseud := subject.Unkeyed()
	for _, tc := range []struct {
		route      int
		ip, header string
		req        func(*http.Request)
	}{
		{0, "127.0.0.5", "", func(r *http.Request) { r.RemoteAddr = "127.0.0.5:40000" }},
		{1, "", "acme", func(r *http.Request) { r.RemoteAddr = "127.0.0.9:1"; r.Header.Set("X-Api-Key", "acme") }},
		{1, "127.0.0.9", "", func(r *http.Request) { r.RemoteAddr = "127.0.0.9:1" }},
	} {
		_, got, _, err := wiring.ProxySubject(proxyRoutes, pseud, tc.route, tc.ip, tc.header)
		if err != nil {
			t.Fatalf("ProxySubject(route %d, %q, %q): %v", tc.route, tc.ip, tc.header, err)
		}
		op, key, err := wiring.ProxyRoute(proxyRoutes.Routes[tc.route], nil)
		if err != nil {
			t.Fatal(err)
		}
		r := &http.Request{Header: http.Header{}}
		tc.req(r)
		kind, id := key(r)
		if want := pseud.Pseudonym(kind, id, op); got != want {
			t.Errorf("ProxySubject(route %d, %q, %q) = %s, want the proxy's %s (operation %q)", tc.route, tc.ip, tc.header, got, want, op)
		}
	}
}

// TestProxySubjectRefused: a client the proxy refuses every request of,
// or that names no client, is refused; the error names the field and
// never the value.
func TestProxySubjectRefused(t *testing.T) {
	for _, tc := range []struct {
		route      int
		ip, header string
		want       string
		edge       bool // the proxy refuses every request of it
	}{
		{1, "", "raw-a,raw-b", "proxy.header: byte 6 is a comma", true},
		{1, "", " raw-pad", "proxy.header: begins or ends with a space", true},
		{1, "", "raw-pad\t", "proxy.header: begins or ends with a space", true},
		{1, "", "raw\x01ctl", "proxy.header: holds a control byte", true},
		{0, "", "raw-hdr", "proxy.header: route 0: its subject is ip", false},
		{0, "127.0.0.77:1", "", "proxy.ip: not a client address", false},
		{0, "[::1]", "", "proxy.ip: not a client address", false},
		{2, "127.0.0.77", "", "proxy.route: 2", false},
	} {
		_, _, _, err := wiring.ProxySubject(proxyRoutes, subject.Unkeyed(), tc.route, tc.ip, tc.header)
		raw := tc.ip + tc.header
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), strings.Trim(raw, " \t[]")) || errors.Is(err, wiring.ErrEdgeRefuses) != tc.edge {
			t.Errorf("ProxySubject(route %d, %q, %q) = %v, want %q… (refused by the edge: %v), without the value", tc.route, tc.ip, tc.header, err, tc.want, tc.edge)
		}
	}
}

// TestListedHeader: the lines of a subject header that name no one
// subject.
func TestListedHeader(t *testing.T) {
	for _, tc := range []struct {
		vals []string
		want bool
	}{
		{nil, false}, {[]string{"a"}, false}, {[]string{"a", "b"}, true}, {[]string{"a,b"}, true}, {[]string{""}, false},
	} {
		if got := wiring.ListedHeader(tc.vals); got != tc.want {
			t.Errorf("ListedHeader(%q) = %v, want %v", tc.vals, got, tc.want)
		}
	}
}
