package httplimit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/subject"
)

// SubjectFunc says who a request is limited as: identity is the raw
// identity (an address prefix, an API key, a user ID) and kind names where
// it came from, e.g. "ip" or "api_key". Both are folded into the pseudonym
// with the route's operation, so the same identity of two kinds has two
// budgets; only the pseudonym reaches the Limiter, a log line or a
// Decision. An empty identity means the request carries none (see
// Options.PassAnonymous).
//
// The builders cover the usual cases (ClientIP, IPUserAgent, Header,
// Principal) and FirstOf chains them; any function of the request will do,
// e.g. one that returns a tenant ID the application resolved. It must be
// safe for concurrent use. To pool unidentified requests in one budget
// instead of refusing them, end a chain with a function that returns a
// constant identity.
type SubjectFunc func(r *http.Request) (kind, identity string)

// Subject kinds of the builders: the kinds the pseudonyms of earlier
// versions were made with, so budgets carry over.
const (
	kindIP          = "ip"
	kindIPUserAgent = "ip_user_agent"
	kindHeader      = "api_key"
	kindPrincipal   = "principal"
)

// ClientIP returns the SubjectFunc of the client address as ips resolves
// it (behind trusted proxies, masked to its prefix, e.g.
// "203.0.113.7/32"), of kind "ip". A nil ips trusts no proxy: the socket
// peer is the client, IPv4 addresses as /32 and IPv6 as /64. A request
// whose RemoteAddr is not an address (a Unix socket) is unidentified.
func ClientIP(ips *subject.IPResolver) SubjectFunc {
	ips = resolver(ips)
	return func(r *http.Request) (string, string) {
		p, err := ips.Prefix(r)
		if err != nil {
			return "", ""
		}
		return kindIP, p.String()
	}
}

// IPUserAgent returns the SubjectFunc of the client address (as in
// ClientIP) together with a digest of the User-Agent, of kind
// "ip_user_agent", so that clients behind one NAT get separate budgets.
// Without a User-Agent it is ClientIP. Use it only where that is
// acceptable: a client that varies its User-Agent gets a fresh budget
// each time.
func IPUserAgent(ips *subject.IPResolver) SubjectFunc {
	clientIP := ClientIP(ips)
	return func(r *http.Request) (string, string) {
		kind, prefix := clientIP(r)
		ua := r.UserAgent()
		if prefix == "" || ua == "" {
			return kind, prefix
		}
		sum := sha256.Sum256([]byte(ua))
		return kindIPUserAgent, prefix + " " + hex.EncodeToString(sum[:8])
	}
}

// resolver is ips, or the zero resolver (no trusted proxy) for nil.
func resolver(ips *subject.IPResolver) *subject.IPResolver {
	if ips != nil {
		return ips
	}
	return &subject.IPResolver{}
}

// Header returns the SubjectFunc of the value of the request header name,
// e.g. "X-API-Key", of kind "api_key". Only its pseudonym is used: the
// value is not checked here, so a client that varies it varies its budget
// (check keys in the handler, or limit by Principal after checking them).
// A request without the header, with an empty value or with the header
// more than once (which names no one subject, and an upstream may read
// either line) is unidentified. A spelling with "_" for "-" (X_API_Key)
// is another header to net/http, but the same one to CGI, WSGI, Rack and
// PHP: in front of such an upstream, drop those spellings (sluice serve's
// proxy does). The error names an invalid header name.
func Header(name string) (SubjectFunc, error) {
	if !httpguts.ValidHeaderFieldName(name) {
		return nil, optionError("Header", fmt.Sprintf("%q", name), "must be a header name such as X-API-Key")
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, string) {
		if vals := r.Header[name]; len(vals) == 1 && vals[0] != "" {
			return kindHeader, vals[0]
		}
		return "", ""
	}, nil
}

// Principal returns the SubjectFunc of the authenticated principal id
// returns, e.g. the user ID an authentication middleware put in the
// request's context, of kind "principal". A request id reports false (or
// "") for is unidentified.
func Principal(id func(*http.Request) (string, bool)) SubjectFunc {
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

// FirstOf returns the SubjectFunc that asks each of fs in turn and
// answers with the first identity, e.g. the principal, else the API key,
// else the client address:
//
//	httplimit.FirstOf(httplimit.Principal(userID), apiKey, httplimit.ClientIP(ips))
func FirstOf(fs ...SubjectFunc) SubjectFunc {
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
