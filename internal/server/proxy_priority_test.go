package server_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
)

// TestProxyPriority: two routes share the operation "site" and so one
// budget of 4 per hour whose sheddable class may use 50 %. /batch is
// sheddable; / is sheddable too unless X-Priority names another class
// and the request comes from proxy.trusted_proxies (here the loopback
// the test's client connects from). Two batch requests pass, the third
// and a / without the header are 429 while the rest is reserved; / with
// "X-Priority: critical" then gets the other two. Behind a proxy whose
// trusted_proxies do not hold the client, the same header is ignored:
// the client cannot name itself critical.
func TestProxyPriority(t *testing.T) {
	up := newUpstream(t)
	policies := []sluice.Policy{{ID: "site", Algorithm: sluice.FixedWindow, Limit: 4, Window: time.Hour, Priorities: map[string]int{"critical": 100, "sheddable": 50}}}
	routes := []config.Route{
		{Match: config.Match{PathPrefix: "/batch"}, Policies: []string{"site"}, Subject: "ip", Operation: "site", Priority: "sheddable"},
		{Match: config.Match{PathPrefix: "/"}, Policies: []string{"site"}, Subject: "ip", Operation: "site", Priority: "sheddable", PriorityHeader: "X-Priority"},
	}
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, TrustedProxies: []string{"127.0.0.1/32", "::1/128"}, Routes: routes}, nil, policies)
	for i, want := range []int{201, 201, 429} {
		if resp := f.send(t, "GET", "/batch", ""); resp.StatusCode != want {
			t.Fatalf("batch request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	if resp := f.send(t, "GET", "/", ""); resp.StatusCode != 429 {
		t.Fatalf("/ without X-Priority (sheddable): %d, want 429", resp.StatusCode)
	}
	for i, want := range []int{201, 201, 429} {
		if resp := f.send(t, "GET", "/", "", "X-Priority: critical"); resp.StatusCode != want {
			t.Fatalf("critical request %d from a trusted peer: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	g := newProxyFixture(t, &config.Proxy{Upstream: up.URL, TrustedProxies: []string{"10.0.0.0/8"}, Routes: routes[1:]}, nil, policies)
	for i, want := range []int{201, 201, 429} {
		if resp := g.send(t, "GET", "/", "", "X-Priority: critical"); resp.StatusCode != want {
			t.Fatalf("request %d naming critical from an untrusted peer: %d, want %d (sheddable)", i+1, resp.StatusCode, want)
		}
	}
}
