package wiring

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/subject"
)

// ProxySubject returns what a tenant plan must name to reach a client of
// the proxy's route route (its index in proxy.routes) as the proxy checks
// it: the route's policies, and the subject's pseudonym (and those under
// older keys) for the client address ip or, on a header: route, the
// header's value; one of them. Each goes through the subject function
// the proxy builds for the route, on a request that carries only it, so
// the address is masked and the kind named exactly as a request's. The
// error says why no plan can reach it.
func ProxySubject(proxy *config.Proxy, pseud *subject.Pseudonymizer, route int, ip, header string) (policies []string, subj string, previous []string, err error) {
	if proxy == nil {
		return nil, "", nil, errors.New("there is no reverse proxy (proxy:)")
	}
	if route < 0 || route >= len(proxy.Routes) {
		return nil, "", nil, fmt.Errorf("route %d: the proxy has routes 0 to %d", route, len(proxy.Routes)-1)
	}
	r := proxy.Routes[route]
	kind, name := r.SubjectKind()
	req := &http.Request{Header: http.Header{}}
	var key subject.KeyFunc
	switch {
	case (ip == "") == (header == ""):
		return nil, "", nil, errors.New("name the client by ip or by header, one of them")
	case kind == config.SubjectIPUserAgent:
		return nil, "", nil, fmt.Errorf("route %d: its subject, ip+user_agent, varies with the client's User-Agent, which a plan cannot name", route)
	case header != "" && kind != config.SubjectHeader:
		return nil, "", nil, fmt.Errorf("route %d: its subject is %s, not a header", route, r.Subject)
	case header != "":
		if key, err = subject.Header(name); err != nil {
			return nil, "", nil, err
		}
		req.Header.Set(name, header)
	default:
		ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: proxy.TrustedProxies})
		if err != nil {
			return nil, "", nil, err
		}
		key = subject.ClientIP(ips)
		req.RemoteAddr = net.JoinHostPort(ip, "0")
	}
	k, id := key(req)
	if id == "" {
		return nil, "", nil, fmt.Errorf("%q: not a client address or header value the proxy would see", ip+header)
	}
	op := r.Match.Operation()
	return r.Policies, pseud.Pseudonym(k, id, op), pseud.Previous(k, id, op), nil
}

// ProxyOverrides returns the config's overrides that name a proxy client
// (proxy: {route, ip | header}) as the check API's Limiter, which the
// proxy decides with, takes them: each resolved by ProxySubject with
// pseud. The error names the override that names no client, or whose
// policy or numbers the route does not take.
func ProxyOverrides(cfg *config.Config, pseud *subject.Pseudonymizer) ([]sluice.Override, error) {
	var out []sluice.Override
	for i, o := range cfg.Overrides {
		if o.Proxy == nil {
			continue
		}
		path := fmt.Sprintf("overrides[%d].proxy", i)
		policies, subj, _, err := ProxySubject(cfg.Proxy, pseud, int(o.Proxy.Route), o.Proxy.IP, o.Proxy.Header)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (line %d)", path, err, cfg.Line(path))
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
