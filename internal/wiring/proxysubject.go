package wiring

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/subject"
)

// ProxyRoute is how the proxy names the budgets of route r: the
// operation folded into every pseudonym (r.Operation, by default the
// match) and the function that reads a request's subject, with ips
// resolving client addresses (an error names a subject Validate
// refuses). The proxy limits by it and a plan names its clients by it
// (ProxySubject), so the two cannot name a subject apart.
func ProxyRoute(r config.Route, ips *subject.IPResolver) (operation string, key subject.KeyFunc, err error) {
	ip := subject.ClientIP(ips)
	operation = cmp.Or(r.Operation, r.Match.Operation())
	switch kind, name := r.SubjectKind(); kind {
	case config.SubjectIP:
		return operation, ip, nil
	case config.SubjectIPUserAgent:
		return operation, ipUserAgent(ip), nil
	case config.SubjectHeader:
		// Without the header, the address. The value is trusted as
		// sent (see docs/proxy.md): a client that varies it varies its budget.
		h, err := subject.Header(name)
		if err != nil {
			return "", nil, err
		}
		return operation, subject.FirstOf(h, ip), nil
	}
	return "", nil, fmt.Errorf("%q: must be ip, ip+user_agent or header:<Name>", r.Subject)
}

// ipUserAgent is the subject of ip+user_agent: the client address (as ip
// reads it) together with a digest of the User-Agent, of kind
// "ip_user_agent", so that clients behind one NAT get separate budgets;
// without a User-Agent, the address. A client that varies its User-Agent
// gets a fresh budget each time.
func ipUserAgent(ip subject.KeyFunc) subject.KeyFunc {
	return func(r *http.Request) (string, string) {
		kind, prefix := ip(r)
		ua := r.UserAgent()
		if prefix == "" || ua == "" {
			return kind, prefix
		}
		sum := sha256.Sum256([]byte(ua))
		return "ip_user_agent", prefix + " " + hex.EncodeToString(sum[:8])
	}
}

// ListedHeader reports whether vals, the lines of a route's subject
// header in one request, name no one subject: more than one line, or a
// list on one (a comma), of which an upstream may read any (RFC 9110,
// 5.3). The proxy answers such a request 400, so no plan names one.
func ListedHeader(vals []string) bool {
	return len(vals) > 1 || len(vals) == 1 && strings.IndexByte(vals[0], ',') >= 0
}

// ErrEdgeRefuses marks a plan naming a subject the edge refuses every
// request of: no request ever reaches its budget, so the plan could
// never apply.
var ErrEdgeRefuses = errors.New("no request of this client reaches the route")

// ProxySubject returns what a tenant plan must name to reach a client of
// the proxy's route route (its index in proxy.routes) as the proxy checks
// it: the route's policies, and the subject's pseudonym (and those under
// older keys) for the client address ip or, on a header: route, the
// header's value; one of them. Each goes through the route's ProxyRoute,
// on a request that carries only it, so the address is masked, the kind
// and the operation named exactly as a request's. The error starts with
// the field it is about ("proxy.header: …") and never holds ip or
// header; it wraps ErrEdgeRefuses for a header value the proxy refuses.
func ProxySubject(proxy *config.Proxy, pseud *subject.Pseudonymizer, route int, ip, header string) (policies []string, subj string, previous []string, err error) {
	if proxy == nil {
		return nil, "", nil, errors.New("proxy: there is no reverse proxy (proxy:)")
	}
	if route < 0 || route >= len(proxy.Routes) {
		return nil, "", nil, fmt.Errorf("proxy.route: %d: the proxy has routes 0 to %d", route, len(proxy.Routes)-1)
	}
	r := proxy.Routes[route]
	kind, name := r.SubjectKind()
	switch {
	case (ip == "") == (header == ""):
		return nil, "", nil, errors.New("proxy: name the client by ip or by header, one of them")
	case kind == config.SubjectIPUserAgent:
		return nil, "", nil, fmt.Errorf("proxy.route: %d: its subject, ip+user_agent, varies with the client's User-Agent, which a plan cannot name", route)
	case header != "" && kind != config.SubjectHeader:
		return nil, "", nil, fmt.Errorf("proxy.header: route %d: its subject is %s, not a header", route, r.Subject)
	case header != "":
		if err := plannableHeader(header); err != nil {
			return nil, "", nil, err
		}
	}
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: proxy.TrustedProxies})
	if err != nil {
		return nil, "", nil, fmt.Errorf("proxy.trusted_proxies: %w", err)
	}
	op, key, err := ProxyRoute(r, ips)
	if err != nil {
		return nil, "", nil, fmt.Errorf("proxy.route: %d: %w", route, err)
	}
	req := &http.Request{Header: http.Header{}}
	if header != "" {
		req.Header.Set(name, header)
	} else {
		req.RemoteAddr = net.JoinHostPort(ip, "0")
	}
	k, id := key(req)
	if id == "" {
		return nil, "", nil, errors.New("proxy.ip: not a client address the proxy would see: an IPv4 or IPv6 address, without port or brackets")
	}
	return r.Policies, pseud.Pseudonym(k, id, op), pseud.Previous(k, id, op), nil
}

// plannableHeader returns why no request reaches the proxy with v as
// its subject header's value, nil when one can: the value by its
// positions only.
func plannableHeader(v string) error {
	if i := strings.IndexByte(v, ','); i >= 0 {
		return fmt.Errorf("proxy.header: byte %d is a comma: the proxy answers 400 to a list in its subject header, so %w", i+1, ErrEdgeRefuses)
	}
	if !httpguts.ValidHeaderFieldValue(v) {
		return fmt.Errorf("proxy.header: holds a control byte no HTTP request carries in a header, so %w", ErrEdgeRefuses)
	}
	if strings.Trim(v, " \t") != v {
		return fmt.Errorf("proxy.header: begins or ends with a space or tab, which HTTP drops before the proxy reads the value, so %w", ErrEdgeRefuses)
	}
	return nil
}

// ProxyOverrides returns the config's overrides that name a proxy client
// (proxy: {route, ip | header}) as the check API's Limiter, which the
// proxy decides with, takes them: each resolved by ProxySubject with
// pseud. The error names the override that names no client (or one the
// proxy refuses), or whose policy or numbers the route does not take,
// and its line; never the client.
func ProxyOverrides(cfg *config.Config, pseud *subject.Pseudonymizer) ([]sluice.Override, error) {
	var out []sluice.Override
	for i, o := range cfg.Overrides {
		if o.Proxy == nil {
			continue
		}
		path := fmt.Sprintf("overrides[%d].proxy", i)
		policies, subj, _, err := ProxySubject(cfg.Proxy, pseud, int(o.Proxy.Route), o.Proxy.IP, o.Proxy.Header)
		if err != nil { // err begins with its field, proxy…
			return nil, fmt.Errorf("overrides[%d].%w (line %d)", i, err, cfg.Line(path))
		}
		policy := o.Policy
		if policy == "" && len(policies) == 1 {
			policy = policies[0]
		}
		if !slices.Contains(policies, policy) {
			return nil, fmt.Errorf("overrides[%d].policy: %q: must be one of the route's policies %q (line %d)", i, policy, policies, cfg.Line(path))
		}
		ov := sluice.Override{Policy: policy, Subject: subj, Limit: o.Limit, Burst: o.Burst, Window: o.Window, Note: o.Note}
		for _, p := range cfg.SluicePolicies() {
			if p.ID != policy {
				continue
			}
			q := p
			q.Limit, q.Burst, q.MaxCost = o.Limit, o.Burst, 0
			if o.Window != 0 {
				q.Window = o.Window
			}
			if err := q.Validate(); err != nil {
				if pe, ok := errors.AsType[*policyerr.Error](err); ok {
					return nil, fmt.Errorf("overrides[%d].%s: %s: %s (line %d)", i, pe.Field, pe.Value, pe.Rule, cfg.Line(path))
				}
				return nil, fmt.Errorf("overrides[%d]: %w (line %d)", i, err, cfg.Line(path))
			}
		}
		out = append(out, ov)
	}
	return out, nil
}
