package grpclimit_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

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
		{Name: echoUnary, Policies: []string{"one"}, Subject: subject.ClientIP(resolver(t, "127.0.0.1"))},
		{Name: otherUnary, Policies: []string{"one"}, Subject: subject.ClientIP(resolver(t, "10.0.0.0/8"))},
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

// TestAnonymous: a call its KeyFunc does not identify is answered
// Unauthenticated without asking the limiter, or passes with
// PassAnonymous.
func TestAnonymous(t *testing.T) {
	apiKey, err := subject.Header("x-api-key")
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
