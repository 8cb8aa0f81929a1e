package grpclimit

import (
	"context"
	"net"
	"net/http"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/subject"
)

// incoming is a server call's context from peer addr with metadata md.
func incoming(addr net.Addr, md ...string) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
	return metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
}

type userKey struct{}

// TestKeyFuncsOnCalls: subject's builders read a call as its HTTP/2
// request: the peer, the forwarding metadata of a trusted peer only,
// metadata values as header fields, the context's principal.
func TestKeyFuncsOnCalls(t *testing.T) {
	proxy := &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 4711}
	client := &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::7"), Port: 4711}
	apiKey, err := subject.Header("x-api-key")
	if err != nil {
		t.Fatal(err)
	}
	principal := subject.Principal(func(r *http.Request) (string, bool) {
		u, ok := r.Context().Value(userKey{}).(string)
		return u, ok
	})
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	trusting := subject.ClientIP(ips)
	tests := []struct {
		name       string
		f          subject.KeyFunc
		ctx        context.Context
		kind, want string
	}{
		{"peer, no proxy trusted", subject.ClientIP(nil), incoming(proxy, "x-forwarded-for", "203.0.113.7"), "ip", "10.1.2.3/32"},
		{"IPv6 peer, masked to /64", subject.ClientIP(nil), incoming(client), "ip", "2001:db8:1:2::/64"},
		{"trusted proxy's x-forwarded-for", trusting, incoming(proxy, "x-forwarded-for", "198.51.100.1, 203.0.113.7"), "ip", "203.0.113.7/32"},
		{"trusted proxy without the header", trusting, incoming(proxy), "ip", "10.1.2.3/32"},
		{"untrusted peer's header ignored", trusting, incoming(client, "x-forwarded-for", "203.0.113.7"), "ip", "2001:db8:1:2::/64"},
		{"no peer", subject.ClientIP(nil), context.Background(), "", ""},
		{"unix socket peer", subject.ClientIP(nil), incoming(&net.UnixAddr{Name: "/run/app.sock", Net: "unix"}), "", ""},
		{"metadata key", apiKey, incoming(proxy, "x-api-key", "k-123"), "api_key", "k-123"},
		{"metadata key missing", apiKey, incoming(proxy), "", ""},
		{"metadata key twice", apiKey, incoming(proxy, "x-api-key", "a", "x-api-key", "b"), "", ""},
		{"metadata key empty", apiKey, incoming(proxy, "x-api-key", ""), "", ""},
		{"principal", principal, context.WithValue(incoming(proxy), userKey{}, "alice"), "principal", "alice"},
		{"no principal", principal, incoming(proxy), "", ""},
		{"nil principal func", subject.Principal(nil), incoming(proxy), "", ""},
	}
	for _, tt := range tests {
		kind, id := tt.f(request(tt.ctx, "/test.Echo/Unary"))
		if kind != tt.kind || id != tt.want {
			t.Errorf("%s: (%q, %q), want (%q, %q)", tt.name, kind, id, tt.kind, tt.want)
		}
	}
}
