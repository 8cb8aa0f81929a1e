package grpclimit_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

func resolver(t *testing.T, trusted ...string) *subject.IPResolver {
	t.Helper()
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: trusted})
	if err != nil {
		t.Fatal(err)
	}
	return ips
}

// TestClientIPThroughTrustedProxy, over a real socket from 127.0.0.1: when
// the peer is a trusted proxy, x-forwarded-for names the caller, so two
// callers behind it have two budgets; when it is not, the header is not
// read, and every caller is the peer, whatever it claims.
func TestClientIPThroughTrustedProxy(t *testing.T) {
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Methods: []grpclimit.Method{
		{Name: echoUnary, Policies: []string{"one"}, Subject: grpclimit.ClientIP(resolver(t, "127.0.0.1"))},
		{Name: otherUnary, Policies: []string{"one"}, Subject: grpclimit.ClientIP(resolver(t, "10.0.0.0/8"))},
	}}, slidingLog("one", 1, time.Minute))
	s := serveInterceptors(t, ints)
	steps := []struct {
		name   string
		method string
		xff    string
		want   codes.Code
	}{
		{"trusted peer, first caller", echoUnary, "203.0.113.7", codes.OK},
		{"trusted peer, first caller again", echoUnary, "203.0.113.7", codes.ResourceExhausted},
		{"trusted peer, second caller", echoUnary, "203.0.113.8", codes.OK},
		{"trusted peer, caller behind the second of two trusted hops", echoUnary, "203.0.113.9, 127.0.0.1", codes.OK},
		{"untrusted peer claiming a caller", otherUnary, "203.0.113.7", codes.OK},
		{"untrusted peer claiming another caller: still the peer", otherUnary, "203.0.113.8", codes.ResourceExhausted},
		{"untrusted peer without the header: the peer", otherUnary, "", codes.ResourceExhausted},
	}
	for _, step := range steps {
		var md []string
		if step.xff != "" {
			md = []string{"x-forwarded-for", step.xff}
		}
		_, err := s.call(t, step.method, md...)
		wantCode(t, step.name, err, step.want)
	}
}

// incoming is a server call's context from peer addr with metadata md.
func incoming(addr net.Addr, md ...string) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
	return metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
}

func TestSubjectFuncs(t *testing.T) {
	proxy := &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 4711}
	client := &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::7"), Port: 4711}
	apiKey, err := grpclimit.Metadata("X-API-Key")
	if err != nil {
		t.Fatal(err)
	}
	principal := grpclimit.Principal(func(ctx context.Context) (string, bool) {
		u, ok := ctx.Value(userKey{}).(string)
		return u, ok
	})
	trusting := grpclimit.ClientIP(resolver(t, "10.0.0.0/8"))
	tests := []struct {
		name       string
		f          grpclimit.SubjectFunc
		ctx        context.Context
		kind, want string
	}{
		{"peer, no proxy trusted", grpclimit.ClientIP(nil), incoming(proxy, "x-forwarded-for", "203.0.113.7"), "ip", "10.1.2.3/32"},
		{"IPv6 peer, masked to /64", grpclimit.ClientIP(nil), incoming(client), "ip", "2001:db8:1:2::/64"},
		{"trusted proxy's x-forwarded-for", trusting, incoming(proxy, "x-forwarded-for", "198.51.100.1, 203.0.113.7"), "ip", "203.0.113.7/32"},
		{"trusted proxy without the header", trusting, incoming(proxy), "ip", "10.1.2.3/32"},
		{"untrusted peer's header ignored", trusting, incoming(client, "x-forwarded-for", "203.0.113.7"), "ip", "2001:db8:1:2::/64"},
		{"no peer", grpclimit.ClientIP(nil), context.Background(), "", ""},
		{"unix socket peer", grpclimit.ClientIP(nil), incoming(&net.UnixAddr{Name: "/run/app.sock", Net: "unix"}), "", ""},
		{"metadata key", apiKey, incoming(proxy, "x-api-key", "k-123"), "api_key", "k-123"},
		{"metadata key missing", apiKey, incoming(proxy), "", ""},
		{"metadata key twice", apiKey, incoming(proxy, "x-api-key", "a", "x-api-key", "b"), "", ""},
		{"metadata key empty", apiKey, incoming(proxy, "x-api-key", ""), "", ""},
		{"principal", principal, context.WithValue(incoming(proxy), userKey{}, "alice"), "principal", "alice"},
		{"no principal", principal, incoming(proxy), "", ""},
		{"nil principal func", grpclimit.Principal(nil), incoming(proxy), "", ""},
	}
	for _, tt := range tests {
		kind, id := tt.f(tt.ctx)
		if kind != tt.kind || id != tt.want {
			t.Errorf("%s: (%q, %q), want (%q, %q)", tt.name, kind, id, tt.kind, tt.want)
		}
	}
}

type userKey struct{}

func TestMetadataErrors(t *testing.T) {
	for _, key := range []string{"", "grpc-timeout", ":authority", "x api key", "x-ключ"} {
		if _, err := grpclimit.Metadata(key); err == nil || !strings.Contains(err.Error(), "grpclimit: Metadata = ") {
			t.Errorf("Metadata(%q) = %v, want an error naming the option", key, err)
		}
	}
}

// TestAnonymous: a call its SubjectFunc does not identify is answered
// Unauthenticated without asking the limiter, or passes with
// PassAnonymous.
func TestAnonymous(t *testing.T) {
	apiKey, err := grpclimit.Metadata("x-api-key")
	if err != nil {
		t.Fatal(err)
	}
	policy := slidingLog("keys", 1, time.Minute)
	for _, pass := range []bool{false, true} {
		ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Default: []string{"keys"}, Subject: apiKey, PassAnonymous: pass}, policy)
		s := serveInterceptors(t, ints)
		_, err := s.call(t, echoUnary)
		if pass {
			wantCode(t, "no key, PassAnonymous", err, codes.OK)
		} else {
			wantCode(t, "no key", err, codes.Unauthenticated)
		}
		_, err = s.call(t, echoUnary, "x-api-key", "k1")
		wantCode(t, "key k1", err, codes.OK)
		_, err = s.call(t, echoUnary, "x-api-key", "k1")
		wantCode(t, "key k1 again", err, codes.ResourceExhausted)
	}
}
