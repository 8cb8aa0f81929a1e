package config

import (
	"fmt"
	"net/netip"
	"net/url"
	pathpkg "path"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/yamlnode"
	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http/httpguts"
)

// DefaultProxyListen is the address the reverse proxy listens on when
// proxy.listen is absent. The proxy has an address of its own so that
// every path reaches the upstream (none is shadowed by /v1/check,
// /metrics or the health checks) and the check API and metrics can stay
// on a private interface while the proxy faces clients.
const DefaultProxyListen = "127.0.0.1:8090"

// DefaultLocalShare is the share of each failure_mode: local policy the
// proxy's local fallback holds when proxy.local_share is absent.
const DefaultLocalShare = 0.1

// Proxy configures the rate-limiting reverse proxy.
type Proxy struct {
	// Listen is the host:port the proxy listens on, distinct from
	// server.listen. Parse defaults it to DefaultProxyListen.
	Listen         string
	Upstream       string   // http:// or https:// URL
	TrustedProxies []string // CIDRs whose X-Forwarded-For is believed
	Routes         []Route
	// LocalShare is the share (0, 1] of a failure_mode: local policy's
	// limit that this instance enforces on its own while the store cannot
	// decide: 1/N for N proxy instances. Parse defaults it to
	// DefaultLocalShare.
	LocalShare float64
	// DecisionTimeout is how long the proxy waits for the store's
	// decision before the route's failure mode answers, 1ms to 10s.
	// Parse defaults it to DefaultDecisionTimeout.
	DecisionTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included, 1s to
	// 1h, so a client that sends its body slowly cannot hold connections
	// forever. Parse defaults it to DefaultProxyReadTimeout.
	ReadTimeout time.Duration
}

// DefaultProxyReadTimeout is proxy.read_timeout when it is absent.
const DefaultProxyReadTimeout = time.Minute

// DefaultDecisionTimeout is server.decision_timeout and
// proxy.decision_timeout when they are absent: 500ms, long enough that a
// burst of 500 concurrent requests on a busy two-core machine with a
// healthy local Redis gets no 503 (100ms gave about half of them one),
// short enough that a failing store is answered by the failure mode well
// within a second. It equals httplimit.DefaultDeadline, the middleware's
// own default (a test of internal/server holds them equal); the config
// names its own so that it imports no edge package.
const DefaultDecisionTimeout = 500 * time.Millisecond

// Route applies policies to matching proxied requests.
type Route struct {
	Match    Match
	Policies []string // policy IDs, checked together
	Subject  string   // "ip", "ip+user_agent" or "header:<Name>". Default: "ip"
	Shadow   bool     // evaluate and report, never block
	// SettleHeader, when set, is the upstream response header (or
	// trailer) reporting what a request really cost, e.g. X-Tokens-Used:
	// the route spends Estimate units up front (sluice.Estimate) and
	// settles them with that value (a header's as it arrives, a
	// trailer's once the body is done).
	SettleHeader string
	// Estimate is what a request of a route with SettleHeader spends up
	// front, at most each policy's max_cost. Default: 1.
	Estimate int64
	// Operation names the route's budgets inside every subject: routes
	// naming the same operation share them (a sheddable route and a
	// critical one on one budget). Default: the match, e.g. "POST /api".
	Operation string
	// Priority is the priority class the route's requests are decided as
	// (sluice.Request.Priority), one a policy of the route declares.
	// Default: "", the class "default".
	Priority string
	// PriorityHeader, when set, is a request header naming the request's
	// class, believed only from a peer in proxy.trusted_proxies (the
	// gateway in front) and only when a policy of the route declares it;
	// otherwise Priority applies.
	PriorityHeader string
	// MaxDelay, when set, holds a request that would be denied for up to
	// this long for the slot it books (httplimit.Route.MaxDelay): one
	// gcra or token_bucket policy. Default: 0, refused at once.
	MaxDelay time.Duration
	// QueueLimit is the most requests the route holds at once. Default:
	// 1000.
	QueueLimit int64
}

// The kinds of subject a proxy route limits by (Route.SubjectKind).
const (
	// SubjectIP is "ip": the client address behind the trusted proxies.
	SubjectIP = "ip"
	// SubjectIPUserAgent is "ip+user_agent": the client address with a
	// digest of the User-Agent; the address alone without one.
	SubjectIPUserAgent = "ip+user_agent"
	// SubjectHeader is "header:<Name>": the value of request header Name;
	// the client address without it.
	SubjectHeader = "header"
)

// SubjectKind returns the kind of r.Subject, SubjectIP, SubjectIPUserAgent
// or SubjectHeader, and for SubjectHeader the header's name, e.g.
// "X-Api-Key" for "header:X-Api-Key". It returns "" for a subject
// Validate refuses.
func (r Route) SubjectKind() (kind, header string) {
	switch name, isHeader := strings.CutPrefix(r.Subject, SubjectHeader+":"); {
	case r.Subject == SubjectIP, r.Subject == SubjectIPUserAgent:
		return r.Subject, ""
	case isHeader && httpguts.ValidHeaderFieldName(name):
		return SubjectHeader, name
	}
	return "", ""
}

// Match selects requests for a Route.
type Match struct {
	PathPrefix string   // must start with "/"
	Methods    []string // empty: every method
}

func (c *Config) validateProxy() []*Error {
	p := c.Proxy
	if p == nil {
		return nil
	}
	var errs []*Error
	if p.Listen == "" {
		errs = append(errs, c.errorAt("proxy.listen", "", "is required: host:port, such as "+DefaultProxyListen))
	} else if rule := checkHostPort(p.Listen, true); rule != "" {
		errs = append(errs, c.errorAt("proxy.listen", strconv.Quote(p.Listen), rule))
	} else if sameAddr(p.Listen, c.Server.Listen) {
		errs = append(errs, c.errorAt("proxy.listen", strconv.Quote(p.Listen), "must differ from server.listen: the proxy has an address of its own"))
	}
	if p.ReadTimeout < time.Second || p.ReadTimeout > time.Hour {
		errs = append(errs, c.errorAt("proxy.read_timeout", p.ReadTimeout.String(), "must be between 1s and 1h"))
	}
	if p.DecisionTimeout < time.Millisecond || p.DecisionTimeout > 10*time.Second {
		errs = append(errs, c.errorAt("proxy.decision_timeout", p.DecisionTimeout.String(), "must be between 1ms and 10s"))
	}
	if !(p.LocalShare > 0 && p.LocalShare <= 1) {
		errs = append(errs, c.errorAt("proxy.local_share", strconv.FormatFloat(p.LocalShare, 'g', -1, 64), "must be more than 0 and at most 1, such as 0.25 for four proxy instances"))
	}
	u, err := url.Parse(p.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, c.errorAt("proxy.upstream", strconv.Quote(p.Upstream), "must be an http:// or https:// URL with a host, such as http://127.0.0.1:9000"))
	}
	for i, cidr := range p.TrustedProxies {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, c.errorAt(fmt.Sprintf("proxy.trusted_proxies[%d]", i), strconv.Quote(cidr), "must be a CIDR such as 10.0.0.0/8 or ::1/128"))
		}
	}
	if len(p.Routes) == 0 {
		return append(errs, c.errorAt("proxy.routes", "", "at least one route is required"))
	}
	ids := make(map[string]bool, len(c.Policies))
	for _, pol := range c.Policies {
		ids[pol.ID] = true
	}
	matches := make(map[string]int, len(p.Routes))
	for i, r := range p.Routes {
		errs = append(errs, c.validateRoute(i, r, ids, matches)...)
	}
	return errs
}

// validateRoute reports every rule proxy.routes[i] breaks. ids are the
// policy IDs; matches records each route's match.
func (c *Config) validateRoute(i int, r Route, ids map[string]bool, matches map[string]int) []*Error {
	path := fmt.Sprintf("proxy.routes[%d]", i)
	var errs []*Error
	if !strings.HasPrefix(r.Match.PathPrefix, "/") {
		errs = append(errs, c.errorAt(path+".match.path_prefix", strconv.Quote(r.Match.PathPrefix), `must start with "/"`))
	}
	for j, m := range r.Match.Methods {
		if !validMethod(m) {
			errs = append(errs, c.errorAt(fmt.Sprintf("%s.match.methods[%d]", path, j), strconv.Quote(m), "must be an upper-case HTTP method such as GET or POST"))
		}
	}
	// The first matching route wins, so a second route with the same
	// match could never apply; it would also share the first's budgets,
	// which are keyed by the match.
	key := r.Match.Operation()
	if j, dup := matches[key]; dup {
		errs = append(errs, c.errorAt(path+".match", "", fmt.Sprintf("matches what proxy.routes[%d] matches (%s): the first matching route wins, so this one would never apply", j, key)))
	} else {
		matches[key] = i
	}
	if len(r.Policies) == 0 {
		errs = append(errs, c.errorAt(path+".policies", "", "at least one policy id is required"))
	}
	for j, id := range r.Policies {
		if !ids[id] {
			errs = append(errs, c.errorAt(fmt.Sprintf("%s.policies[%d]", path, j), strconv.Quote(id), "is not the id of any policy"))
		}
	}
	if kind, _ := r.SubjectKind(); kind == "" {
		errs = append(errs, c.errorAt(path+".subject", strconv.Quote(r.Subject), "must be one of ip, ip+user_agent, header:<Name>"))
	}
	errs = append(errs, c.validatePriority(path, r)...)
	errs = append(errs, c.validateQueue(path, r)...)
	return append(errs, c.validateSettle(path, r)...)
}

// validatePriority reports every rule a proxy route at path breaks with
// its operation, priority and priority_header: an operation of printable
// ASCII; a class one of its policies declares (or "default"); a header
// field name, believed only from proxy.trusted_proxies, so those must be
// set.
func (c *Config) validatePriority(path string, r Route) []*Error {
	var errs []*Error
	if strings.ContainsFunc(r.Operation, func(c rune) bool { return c < ' ' || c > '~' }) || len(r.Operation) > 256 {
		errs = append(errs, c.errorAt(path+".operation", strconv.Quote(r.Operation), "must be at most 256 characters of printable ASCII"))
	}
	if r.Priority != "" && r.Priority != "default" {
		declared := false
		for _, id := range r.Policies {
			for _, p := range c.Policies {
				_, ok := p.Priorities[r.Priority]
				declared = declared || p.ID == id && ok
			}
		}
		if !declared {
			errs = append(errs, c.errorAt(path+".priority", strconv.Quote(r.Priority), "must be a class one of the route's policies declares under priorities, or default"))
		}
	}
	switch {
	case r.PriorityHeader == "":
	case !httpguts.ValidHeaderFieldName(r.PriorityHeader):
		errs = append(errs, c.errorAt(path+".priority_header", strconv.Quote(r.PriorityHeader), "must be a header field name such as X-Priority"))
	case c.Proxy == nil || len(c.Proxy.TrustedProxies) == 0:
		errs = append(errs, c.errorAt(path+".priority_header", strconv.Quote(r.PriorityHeader), "is believed only from proxy.trusted_proxies, and none are set: a client could name itself critical"))
	}
	return errs
}

// Operation is the name the proxy gives the budgets of a route with this
// match, e.g. "POST /login" or "* /api": the methods and the cleaned path
// prefix, as httplimit.Route names them by default.
func (m Match) Operation() string {
	methods := "*"
	if len(m.Methods) > 0 {
		methods = strings.Join(m.Methods, ",")
	}
	prefix := m.PathPrefix
	if prefix != "/" {
		prefix = strings.TrimSuffix(pathpkg.Clean(prefix), "/")
	}
	return methods + " " + prefix
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

func (d *decoder) proxy(n *yaml.Node) *Proxy {
	m, ok := d.mapping("proxy", n, "listen", "upstream", "trusted_proxies", "routes", "local_share", "decision_timeout", "read_timeout")
	if !ok {
		return nil
	}
	p := &Proxy{Listen: DefaultProxyListen, LocalShare: DefaultLocalShare, DecisionTimeout: DefaultDecisionTimeout, ReadTimeout: DefaultProxyReadTimeout}
	d.str("proxy.listen", m["listen"], &p.Listen)
	d.str("proxy.upstream", m["upstream"], &p.Upstream)
	d.float("proxy.local_share", m["local_share"], &p.LocalShare)
	d.duration("proxy.decision_timeout", m["decision_timeout"], &p.DecisionTimeout)
	d.duration("proxy.read_timeout", m["read_timeout"], &p.ReadTimeout)
	d.strs("proxy.trusted_proxies", m["trusted_proxies"], &p.TrustedProxies)
	if v := m["routes"]; v != nil {
		if items, ok := d.sequence("proxy.routes", v); ok {
			p.Routes = make([]Route, len(items))
			for i, item := range items {
				d.route(fmt.Sprintf("proxy.routes[%d]", i), item, &p.Routes[i])
			}
		}
	}
	return p
}

func (d *decoder) route(path string, n *yaml.Node, r *Route) {
	m, ok := d.mapping(path, n, "match", "policies", "subject", "shadow", "settle_header", "estimate", "operation", "priority", "priority_header", "max_delay", "queue_limit")
	if !ok {
		return
	}
	r.Subject = "ip"
	d.strs(path+".policies", m["policies"], &r.Policies)
	d.str(path+".subject", m["subject"], &r.Subject)
	d.bool(path+".shadow", m["shadow"], &r.Shadow)
	d.str(path+".settle_header", m["settle_header"], &r.SettleHeader)
	d.int(path+".estimate", m["estimate"], &r.Estimate)
	d.str(path+".operation", m["operation"], &r.Operation)
	d.str(path+".priority", m["priority"], &r.Priority)
	d.str(path+".priority_header", m["priority_header"], &r.PriorityHeader)
	d.duration(path+".max_delay", m["max_delay"], &r.MaxDelay)
	d.int(path+".queue_limit", m["queue_limit"], &r.QueueLimit)
	if m["match"] == nil {
		d.fail(&Error{Path: path + ".match", Rule: "is required", Line: yamlnode.Resolve(n).Line})
		return
	}
	mm, ok := d.mapping(path+".match", m["match"], "path_prefix", "methods")
	if !ok {
		return
	}
	d.str(path+".match.path_prefix", mm["path_prefix"], &r.Match.PathPrefix)
	d.strs(path+".match.methods", mm["methods"], &r.Match.Methods)
}
