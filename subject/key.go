package subject

import (
	"fmt"
	"net/http"

	"golang.org/x/net/http/httpguts"
)

// KeyFunc says who a request is limited as: identity is the raw identity
// (an address prefix, an API key, a user ID) and kind names where it came
// from, e.g. "ip" or "api_key". Both are folded into the pseudonym with
// the rule's operation, so the same identity of two kinds has two
// budgets; only the pseudonym reaches the Limiter, a log line or a
// decision. An empty identity means the request carries none.
//
// It is the one key function of every edge: httplimit calls it with the
// request; grpclimit with the call seen as the HTTP/2 request it is (its
// metadata as Header, the peer as RemoteAddr, the full method as
// URL.Path, the call's context as Context), so the same builders serve
// both. ClientIP, Header and Principal build the usual ones and FirstOf
// chains them; any function of the request will do, e.g. one that
// returns a tenant the application resolved. It must be safe for
// concurrent use. To pool unidentified requests in one budget instead of
// refusing them, end a chain with a function that returns a constant
// identity.
type KeyFunc func(r *http.Request) (kind, identity string)

// Kinds of the builders' identities: the kinds the pseudonyms of earlier
// versions were made with, so budgets carry over.
const (
	kindIP        = "ip"
	kindHeader    = "api_key"
	kindPrincipal = "principal"
)

// ClientIP returns the KeyFunc of the client address as ips resolves it
// (behind trusted proxies, masked to its prefix, e.g. "203.0.113.7/32"),
// of kind "ip". A nil ips trusts no proxy: the socket peer is the client,
// IPv4 addresses as /32 and IPv6 as /64. A request whose RemoteAddr is
// not an address (a Unix socket) is unidentified.
func ClientIP(ips *IPResolver) KeyFunc {
	if ips == nil {
		ips = &IPResolver{}
	}
	return func(r *http.Request) (string, string) {
		p, err := ips.Prefix(r)
		if err != nil {
			return "", ""
		}
		return kindIP, p.String()
	}
}

// Header returns the KeyFunc of the value of the request header (for
// gRPC, the metadata key) name, e.g. "X-API-Key", of kind "api_key". Only
// its pseudonym is used: the value is not checked here, so a client that
// varies it varies its budget (check keys first, or limit by Principal
// after checking them). A request without the header, with an empty value
// or with the header more than once (which names no one subject, and an
// upstream may read either line) is unidentified. A spelling with "_" for
// "-" (X_API_Key) is another header to net/http, but the same one to CGI,
// WSGI, Rack and PHP: in front of such an upstream, drop those spellings
// (sluice serve's proxy does). The error names an invalid header name.
func Header(name string) (KeyFunc, error) {
	if !httpguts.ValidHeaderFieldName(name) {
		return nil, fmt.Errorf("subject: Header(%q): must be a header name such as X-API-Key", name)
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, string) {
		if vals := r.Header[name]; len(vals) == 1 && vals[0] != "" {
			return kindHeader, vals[0]
		}
		return "", ""
	}, nil
}

// Principal returns the KeyFunc of the authenticated principal id
// returns, of kind "principal": e.g. the user ID an authentication
// middleware (or, for gRPC, an authentication interceptor installed
// before grpclimit's) put in the request's context, or the common name of
// a verified client certificate. A request id reports false (or "") for
// is unidentified, as is every request with a nil id.
func Principal(id func(r *http.Request) (string, bool)) KeyFunc {
	return func(r *http.Request) (string, string) {
		if id == nil {
			return "", ""
		}
		if p, ok := id(r); ok && p != "" {
			return kindPrincipal, p
		}
		return "", ""
	}
}

// FirstOf returns the KeyFunc that asks each of fs in turn and answers
// with the first identity, e.g. the principal, else the API key, else the
// client address:
//
//	subject.FirstOf(subject.Principal(userID), apiKey, subject.ClientIP(ips))
func FirstOf(fs ...KeyFunc) KeyFunc {
	return func(r *http.Request) (string, string) {
		for _, f := range fs {
			if f == nil {
				continue
			}
			if kind, id := f(r); id != "" {
				return kind, id
			}
		}
		return "", ""
	}
}
