package grpclimit

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/subject"
)

// SubjectFunc says who a call is limited as, from the call's context:
// identity is the raw identity (an address prefix, an API key, a user
// ID) and kind names where it came from, e.g. "ip" or "api_key". Both
// are folded into the pseudonym with the rule's operation, so the same
// identity of two kinds has two budgets; only the pseudonym reaches the
// Limiter or a log line. An empty identity means the call carries none
// (see Options.PassAnonymous).
//
// ClientIP, Metadata and Principal build the usual ones; any function of
// the context will do, e.g. one that tries the principal and then the
// address, or returns a tenant the service resolved. The full method name
// is grpc.Method(ctx). It must be safe for concurrent use.
type SubjectFunc func(ctx context.Context) (kind, identity string)

// Subject kinds of the builders: httplimit's, so a service limited both
// ways names its callers alike.
const (
	kindIP        = "ip"
	kindMetadata  = "api_key"
	kindPrincipal = "principal"
)

// The forwarding metadata an IPResolver may read, as proxies in front of
// gRPC servers (Envoy, nginx) send them.
const (
	mdXForwardedFor = "x-forwarded-for"
	mdForwarded     = "forwarded"
)

// ClientIP returns the SubjectFunc of the caller's address as ips
// resolves it, masked to its prefix (e.g. "203.0.113.7/32"), of kind
// "ip". The socket peer (peer.FromContext) is the caller unless ips
// trusts it as a proxy; only then is the forwarding metadata read at all
// ("x-forwarded-for", or "forwarded" when ips reads Forwarded), by the
// rules of subject.IPResolver: the right-most hop that is not a trusted
// proxy. A nil ips trusts no proxy. A call whose peer is not an IP
// address (a Unix socket) is unidentified.
func ClientIP(ips *subject.IPResolver) SubjectFunc {
	if ips == nil {
		ips = &subject.IPResolver{}
	}
	return func(ctx context.Context) (string, string) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", ""
		}
		r := http.Request{RemoteAddr: p.Addr.String()}
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil && ips.Trusts(ap.Addr()) {
			r.Header = http.Header{}
			if v := metadata.ValueFromIncomingContext(ctx, mdXForwardedFor); len(v) > 0 {
				r.Header["X-Forwarded-For"] = v
			}
			if v := metadata.ValueFromIncomingContext(ctx, mdForwarded); len(v) > 0 {
				r.Header["Forwarded"] = v
			}
		}
		pfx, err := ips.Prefix(&r)
		if err != nil {
			return "", ""
		}
		return kindIP, pfx.String()
	}
}

// Metadata returns the SubjectFunc of the value of the metadata key,
// e.g. "x-api-key", of kind "api_key". Keys are case-insensitive; only
// the value's pseudonym is used, and it is not checked here, so a caller
// that varies it varies its budget (check keys first, or limit by
// Principal after checking them). A call without the key, with an empty
// value or with the key more than once is unidentified. The error names
// a key gRPC would not carry or reserves ("grpc-" keys, ":authority").
func Metadata(key string) (SubjectFunc, error) {
	key = strings.ToLower(key)
	if key == "" || strings.HasPrefix(key, "grpc-") || strings.ContainsFunc(key, func(r rune) bool {
		return !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_' || r == '.')
	}) {
		return nil, optionError("Metadata", fmt.Sprintf("%q", key), `must be a metadata key of a-z 0-9 - _ . not starting with "grpc-", such as x-api-key`)
	}
	return func(ctx context.Context) (string, string) {
		if v := metadata.ValueFromIncomingContext(ctx, key); len(v) == 1 && v[0] != "" {
			return kindMetadata, v[0]
		}
		return "", ""
	}, nil
}

// Principal returns the SubjectFunc of the authenticated principal id
// finds in a call's context, of kind "principal". grpclimit does not
// authenticate: id reads what the service's authentication established,
// so install grpclimit's interceptors after the authenticating ones.
// Usually id reads the user an authentication interceptor put in the
// context, or, with mutual TLS, the verified client certificate:
//
//	func(ctx context.Context) (string, bool) {
//		p, ok := peer.FromContext(ctx)
//		if !ok {
//			return "", false
//		}
//		tls, ok := p.AuthInfo.(credentials.TLSInfo)
//		if !ok || len(tls.State.VerifiedChains) == 0 {
//			return "", false
//		}
//		return tls.State.VerifiedChains[0][0].Subject.CommonName, true
//	}
//
// A call id reports false (or "") for is unidentified, as is every call
// with a nil id.
func Principal(id func(ctx context.Context) (string, bool)) SubjectFunc {
	return func(ctx context.Context) (string, string) {
		if id == nil {
			return "", ""
		}
		if p, ok := id(ctx); ok && p != "" {
			return kindPrincipal, p
		}
		return "", ""
	}
}
