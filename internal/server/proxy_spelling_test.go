package server_test

import (
	"bufio"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/config"
)

// rawSend writes one request to the proxy at rawURL byte for byte, target
// as given (a client library would escape it), and returns the status.
func rawSend(t *testing.T, rawURL, method, target string, header ...string) int {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := method + " " + target + " HTTP/1.1\r\nHost: " + u.Host + "\r\nContent-Length: 0\r\nConnection: close\r\n"
	for _, h := range header {
		req += h + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %q: %v", method, target, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestProxyRefusesSpellingsOfALimitedRoute: once POST /login is
// exhausted, no spelling of it that an upstream may read as /login gets
// through: each is either refused (400) or counted against /login (429),
// and none reaches the upstream.
func TestProxyRefusesSpellingsOfALimitedRoute(t *testing.T) {
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/login", Methods: []string{"POST"}}, Policies: []string{"three"}, Subject: "ip"},
	}}, nil, proxyPolicies)
	for i := range 3 {
		if got := rawSend(t, f.url, "POST", "/login"); got != 201 {
			t.Fatalf("POST /login %d: %d, want 201", i+1, got)
		}
	}
	if got := rawSend(t, f.url, "POST", "/login"); got != 429 {
		t.Fatalf("POST /login once exhausted: %d, want 429", got)
	}
	before := len(up.requests())
	for _, tt := range []struct {
		target string
		want   int
	}{
		{`/login\`, 400},
		{`/\login`, 400},
		{`/login%5C`, 400},
		{`/login%5c/`, 400},
		{"/login%00", 400},
		{"/login%00.php", 400},
		{"/login\x00", 400}, // net/http refuses raw control bytes itself
		{"/login%0A", 400},
		{"/login%09", 400},
		{"/login%7F", 400},
		{"/login%2F", 400},
		{"/%2Flogin", 400},
		{"/x%2F..%2Flogin", 400},
		{"/x/..;/login", 400},
		{"/x/...;/login", 400},
		{"/login%zz", 400},
		{"/login#x", 400},   // forwarded as /login%23x, unlimited: a server may end the path at '#'
		{"/login%23x", 400}, // the same, encoded
		{"/%2E%2E/login", 429},
		{"/x/%2e%2e/login", 429},
		{"/x/.%2E/login", 429},
		{"/%6Cogin", 429},
		{"/log%69n", 429},
		{"//login", 429},
		{"/login//", 429},
		{"/./login", 429},
		{"/x/../login", 429},
		{"/login/.", 429},
		{"/login/x/..", 429},
		{"/LOGIN", 429},
		{"/login;jsessionid=1", 429},
		{"/login..;/", 429},
		{"/login.", 429},
		{"/login%20", 429},
	} {
		if got := rawSend(t, f.url, "POST", tt.target); got != tt.want {
			t.Errorf("POST %q after /login is exhausted: %d, want %d", tt.target, got, tt.want)
		}
	}
	if n := len(up.requests()); n != before {
		for _, r := range up.requests()[before:] {
			t.Errorf("reached the upstream: %s %s", r.Method, r.URI)
		}
	}
}

// TestProxyNormalisesPaths: a path of no route goes on in the normal
// form the routes matched it in, and a path servers read differently is
// refused whatever its route.
func TestProxyNormalisesPaths(t *testing.T) {
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/login"}, Policies: []string{"three"}, Subject: "ip"},
	}}, nil, proxyPolicies)
	for _, tt := range []struct {
		target string
		want   int
		uri    string // what the upstream reads
	}{
		{"/docs//a/./b/../c%2Ed?q=%2F", 201, "/docs/a/c.d?q=%2F"},
		{"/caf%C3%A9/%7euser/", 201, "/caf%C3%A9/~user/"},
		{"/a/%2e%2e/%2E%2E/../x", 201, "/x"},
		{"/files/a%2Fb", 400, ""},
		{`/files\a`, 400, ""},
	} {
		before := len(up.requests())
		if got := rawSend(t, f.url, "GET", tt.target); got != tt.want {
			t.Errorf("GET %q: %d, want %d", tt.target, got, tt.want)
			continue
		}
		reqs := up.requests()[before:]
		switch {
		case tt.uri == "" && len(reqs) != 0:
			t.Errorf("GET %q reached the upstream as %q, want it refused", tt.target, reqs[0].URI)
		case tt.uri != "" && (len(reqs) != 1 || reqs[0].URI != tt.uri):
			t.Errorf("GET %q reached the upstream as %+v, want %q", tt.target, reqs, tt.uri)
		}
	}
}

// TestProxyDropsSubjectHeaderSpellings: once API key K1 is exhausted on
// a route keyed on X-Api-Key, a spelling an upstream folds into the same
// name (CGI's HTTP_X_API_KEY) neither spends the address's budget as K1
// nor reaches the upstream: the upstream never reads K1 from it.
func TestProxyDropsSubjectHeaderSpellings(t *testing.T) {
	up := newUpstream(t)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/"}, Policies: []string{"keyed"}, Subject: "header:X-Api-Key"},
	}}, nil, proxyPolicies)
	for i, want := range []int{201, 201, 429} {
		if got := rawSend(t, f.url, "GET", "/", "X-Api-Key: K1"); got != want {
			t.Fatalf("K1 request %d: %d, want %d", i+1, got, want)
		}
	}
	for _, tt := range []struct {
		header []string
		want   int
	}{
		{[]string{"X_Api_Key: K1"}, 201},                  // the address's budget, without the key
		{[]string{"x_api_key: K1"}, 201},                  // the address's second
		{[]string{"X_API_KEY: K1", "X-Api-Key: K1"}, 429}, // K1's: the variant dropped
		{[]string{"X-API-KEY: K1"}, 429},                  // any case is the header itself
		{[]string{"X-Api-Key: K1", "x-api-key: K2"}, 400}, // twice
		{[]string{"X_Api_Key: K2"}, 429},                  // the address is spent now
	} {
		before := len(up.requests())
		if got := rawSend(t, f.url, "GET", "/", tt.header...); got != tt.want {
			t.Errorf("GET / with %q: %d, want %d", tt.header, got, tt.want)
		}
		for _, r := range up.requests()[before:] {
			for name := range r.Header {
				if strings.EqualFold(strings.ReplaceAll(name, "_", "-"), "X-Api-Key") && name != "X-Api-Key" {
					t.Errorf("GET / with %q: the upstream read header %s: %q", tt.header, name, r.Header[name])
				}
			}
		}
	}
}
