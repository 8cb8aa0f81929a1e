package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // time_zone resolves where the machine has no zoneinfo

	"github.com/sluicehq/sluice"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/yamlnode"
)

// MaxSize is the largest config Parse reads, in bytes.
const MaxSize = 1 << 20

// Parse reads one YAML document from r, decodes it strictly, fills in the
// defaults of absent keys and validates it. Every error is an *Error with
// the line it was found on, or Errors (sorted by line) when there are
// several: Parse reports every problem it finds in one pass, unknown keys
// and wrong types beside the rules the values that did decode break
// (cross-field rules included, such as duplicate ids). When the document
// decodes but breaks rules, Parse returns the decoded Config with the
// error, so that a tool can report more (sluice validate checks the
// environment too); such a Config must not be served. When a value did
// not decode, Parse returns the Config of the values that did (the others
// left at their zero values) for the same use, never to be served; the
// Config is nil only when the document is not a mapping at all.
func Parse(r io.Reader) (*Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: read: %w", err)
	}
	if len(data) > MaxSize {
		return nil, &Error{Rule: fmt.Sprintf("the config is larger than %d bytes", MaxSize)}
	}
	root, err := parseYAML(data)
	if err != nil {
		return nil, err
	}
	d := &decoder{pos: map[string]position{}, bad: map[string]bool{}, misspelt: map[string]bool{}}
	c := d.config(root)
	if c == nil {
		return nil, joinErrors(d.errs)
	}
	c.pos = d.pos
	verr := c.Validate()
	if len(d.errs) == 0 {
		if verr != nil {
			return c, verr
		}
		return c, nil
	}
	return c, joinErrors(append(d.errs, d.judged(verr)...))
}

// judged returns the errors of Validate that are about values that
// decoded: a value that did not decode was left at its zero value, and
// what the rules say of that zero would only repeat the decoding error.
func (d *decoder) judged(verr error) []*Error {
	var es Errors
	var e *Error
	switch {
	case errors.As(verr, &es):
	case errors.As(verr, &e):
		es = Errors{e}
	}
	idBad := false // a policy whose id may be missing from the ids Validate knows
	for p := range d.bad {
		if p == "policies" || strings.HasPrefix(p, "policies[") && (!strings.Contains(p, ".") || strings.HasSuffix(p, "].id")) {
			idBad = true
		}
	}
	var out []*Error
	for _, e := range es {
		if d.covered(e.Path) {
			continue
		}
		// A route naming a policy whose entry did not decode may name it
		// rightly.
		if idBad && (strings.HasPrefix(e.Path, "proxy.routes[") || strings.HasPrefix(e.Path, "overrides[")) && strings.HasSuffix(e.Rule, "is not the id of any policy") {
			continue
		}
		out = append(out, e)
	}
	return out
}

// covered reports whether path, or a value enclosing it, did not decode.
func (d *decoder) covered(path string) bool {
	for q := path; q != ""; q = parent(q) {
		if d.bad[q] {
			return true
		}
	}
	return false
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// parseYAML returns the root node of the only document in data. The
// parser is third-party code: a panic in it becomes an error here.
func parseYAML(data []byte) (root *yaml.Node, err error) {
	defer func() {
		if p := recover(); p != nil {
			root, err = nil, &Error{Rule: fmt.Sprintf("invalid YAML: %v", p)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return nil, &Error{Rule: "the config is empty: it " + needsSomething, Line: 1}
	case err != nil:
		return nil, syntaxError(data, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, &Error{Rule: "only one YAML document is allowed", Line: next.Line}
	}
	if len(doc.Content) == 0 {
		return nil, &Error{Rule: "the config is empty: it " + needsSomething, Line: 1}
	}
	return doc.Content[0], nil
}

// syntaxError turns the parser's err about data into an *Error at the
// line and column where the parser stopped. The parser names the line
// where the enclosing block began (line 1 for a mis-indented key deep in
// a list), so the line is found again here: the first line whose
// addition makes the document fail with the same problem, by bisection
// over the document's prefixes (a few dozen parses for the largest
// config); the column is where that line's text starts after its
// indentation.
func syntaxError(data []byte, err error) *Error {
	e := &Error{Rule: "invalid YAML: " + err.Error()}
	m := yamlLine.FindStringSubmatch(err.Error())
	if m == nil {
		return e
	}
	e.Rule = "invalid YAML: " + m[2]
	e.Line, _ = strconv.Atoi(m[1])
	lines := bytes.SplitAfter(data, []byte("\n"))
	fails := func(n int) bool {
		var doc yaml.Node
		err := yaml.Unmarshal(bytes.Join(lines[:n], nil), &doc)
		if err == nil {
			return false
		}
		mm := yamlLine.FindStringSubmatch(err.Error())
		return mm != nil && mm[2] == m[2]
	}
	// lo never fails, hi does: the answer is the smallest failing prefix.
	lo, hi := 0, len(lines)
	if !fails(hi) {
		return e
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	line := lines[hi-1]
	e.Line, e.Column = hi, len(line)-len(bytes.TrimLeft(line, " "))+1
	return e
}

// needsSomething is the rule a config breaks when it has nothing to
// serve.
const needsSomething = "needs at least one thing to serve: policies, a proxy: section or an envoy: section"

// decoder walks the node tree, recording where each value was written
// and every value that does not decode; it goes on past each one, so
// that one pass reports them all.
type decoder struct {
	pos  map[string]position
	errs []*Error
	bad  map[string]bool // paths whose value did not decode, or is missing
	// misspelt holds the paths an unknown key looks like a misspelling
	// of, e.g. "policies[0].window" for "policies[0].windw".
	misspelt map[string]bool
}

// fail records e, and its path as one that did not decode.
func (d *decoder) fail(e *Error) {
	d.errs = append(d.errs, e)
	d.bad[e.Path] = true
}

// sections are the top-level keys of a config, each with the function
// that decodes it into c. A new section is one row here, one field of
// Config and its rules in Validate.
var sections = []struct {
	key    string
	decode func(d *decoder, c *Config, n *yaml.Node)
}{
	{"server", func(d *decoder, c *Config, n *yaml.Node) { d.server(&c.Server, n) }},
	{"store", func(d *decoder, c *Config, n *yaml.Node) { d.store(&c.Store, n) }},
	{"policies", func(d *decoder, c *Config, n *yaml.Node) { c.Policies = d.policies(n) }},
	{"subjects", func(d *decoder, c *Config, n *yaml.Node) { d.subjects(&c.Subjects, n) }},
	{"proxy", func(d *decoder, c *Config, n *yaml.Node) { c.Proxy = d.proxy(n) }},
	{"envoy", func(d *decoder, c *Config, n *yaml.Node) { c.Envoy = d.envoy(n) }},
	{"telemetry", func(d *decoder, c *Config, n *yaml.Node) { c.Telemetry = d.telemetry(n) }},
	{"overrides", func(d *decoder, c *Config, n *yaml.Node) { c.Overrides = d.overrides(n) }},
}

// overrides decodes the overrides: section, a list of {policy, subject,
// limit, burst, window, note}.
func (d *decoder) overrides(n *yaml.Node) []Override {
	items, ok := d.sequence("overrides", n)
	if !ok {
		return nil
	}
	os := make([]Override, len(items))
	for i, item := range items {
		path := fmt.Sprintf("overrides[%d]", i)
		m, ok := d.mapping(path, item, "policy", "subject", "envoy", "proxy", "limit", "burst", "window", "note")
		if !ok {
			continue
		}
		if e, p := m["envoy"], m["proxy"]; e != nil || p != nil {
			d.required(path, item, m, "limit")
			if e != nil {
				os[i].Envoy = d.envoyDescriptor(path+".envoy", e)
			}
			if p != nil {
				os[i].Proxy = d.proxyClient(path+".proxy", p)
			}
		} else {
			d.required(path, item, m, "policy", "subject", "limit")
		}
		d.str(path+".policy", m["policy"], &os[i].Policy)
		d.str(path+".subject", m["subject"], &os[i].Subject)
		d.int(path+".limit", m["limit"], &os[i].Limit)
		d.int(path+".burst", m["burst"], &os[i].Burst)
		d.duration(path+".window", m["window"], &os[i].Window)
		d.str(path+".note", m["note"], &os[i].Note)
	}
	return os
}

// envoyDescriptor decodes an override's envoy: {domain, entries: [{key,
// value}, …]}; never nil, so a descriptor that did not decode still
// marks the override as naming an Envoy subject.
func (d *decoder) envoyDescriptor(path string, n *yaml.Node) *EnvoyDescriptor {
	e := &EnvoyDescriptor{}
	m, ok := d.mapping(path, n, "domain", "entries")
	if !ok {
		return e
	}
	d.required(path, n, m, "domain", "entries")
	d.str(path+".domain", m["domain"], &e.Domain)
	if m["entries"] == nil {
		return e
	}
	items, ok := d.sequence(path+".entries", m["entries"])
	if !ok {
		return e
	}
	for i, item := range items {
		ipath := fmt.Sprintf("%s.entries[%d]", path, i)
		em, ok := d.mapping(ipath, item, "key", "value")
		if !ok {
			continue
		}
		d.required(ipath, item, em, "key", "value")
		var kv [2]string
		d.str(ipath+".key", em["key"], &kv[0])
		d.str(ipath+".value", em["value"], &kv[1])
		e.Entries = append(e.Entries, kv)
	}
	return e
}

// proxyClient decodes an override's proxy: {route, ip | header}; never
// nil, so one that did not decode still marks the override as naming a
// proxy client.
func (d *decoder) proxyClient(path string, n *yaml.Node) *ProxyClient {
	p := &ProxyClient{Route: -1}
	m, ok := d.mapping(path, n, "route", "ip", "header")
	if !ok {
		return p
	}
	d.required(path, n, m, "route")
	d.int(path+".route", m["route"], &p.Route)
	d.str(path+".ip", m["ip"], &p.IP)
	d.str(path+".header", m["header"], &p.Header)
	return p
}

// config decodes the document; nil when it is not a mapping.
func (d *decoder) config(n *yaml.Node) *Config {
	n = yamlnode.Resolve(n)
	if n.Tag == "!!null" {
		d.fail(&Error{Rule: "the config is empty: it " + needsSomething, Line: n.Line})
		return nil
	}
	keys := make([]string, len(sections))
	for i, s := range sections {
		keys[i] = s.key
	}
	m, ok := d.mapping("", n, keys...)
	if !ok {
		return nil
	}
	d.pos[""] = position{line: n.Line}
	c := &Config{Server: Server{Listen: DefaultListen, DecisionTimeout: DefaultDecisionTimeout}, Store: Store{Type: StoreMemory}}
	for _, s := range sections {
		if v := m[s.key]; v != nil {
			s.decode(d, c, v)
		}
	}
	return c
}

func (d *decoder) server(s *Server, n *yaml.Node) {
	m, ok := d.mapping("server", n, "listen", "tls", "auth", "decision_timeout")
	if !ok {
		return
	}
	d.str("server.listen", m["listen"], &s.Listen)
	d.duration("server.decision_timeout", m["decision_timeout"], &s.DecisionTimeout)
	if v := m["tls"]; v != nil {
		if tm, ok := d.mapping("server.tls", v, "cert_file", "key_file"); ok {
			s.TLS = &TLS{}
			d.str("server.tls.cert_file", tm["cert_file"], &s.TLS.CertFile)
			d.str("server.tls.key_file", tm["key_file"], &s.TLS.KeyFile)
		}
	}
	v := m["auth"]
	if v == nil {
		return
	}
	am, ok := d.mapping("server.auth", v, "tokens")
	if !ok {
		return
	}
	s.Auth = &Auth{}
	if am["tokens"] == nil {
		return
	}
	items, ok := d.sequence("server.auth.tokens", am["tokens"])
	if !ok {
		return
	}
	s.Auth.Tokens = make([]Token, len(items))
	for i, item := range items {
		d.token(fmt.Sprintf("server.auth.tokens[%d]", i), item, &s.Auth.Tokens[i])
	}
}

func (d *decoder) token(path string, n *yaml.Node, t *Token) {
	m, ok := d.mapping(path, n, "id", "secret_env", "scopes")
	if !ok {
		return
	}
	d.required(path, n, m, "id", "secret_env", "scopes")
	d.str(path+".id", m["id"], &t.ID)
	d.str(path+".secret_env", m["secret_env"], &t.SecretEnv)
	d.strs(path+".scopes", m["scopes"], &t.Scopes)
}

// required records an error for each of keys that mapping m, read from
// n at path, lacks.
func (d *decoder) required(path string, n *yaml.Node, m map[string]*yaml.Node, keys ...string) {
	for _, key := range keys {
		d.require(path, n, m, key, "is required")
	}
}

// require records rule as an error when mapping m, read from n at path,
// lacks key. A key an unknown key looks like a misspelling of is not
// reported again (the unknown key's error names it), nor are the keys of
// a mapping with a merge key, which may have held them.
func (d *decoder) require(path string, n *yaml.Node, m map[string]*yaml.Node, key, rule string) {
	switch {
	case m[key] != nil:
	case d.bad[path] || d.misspelt[path+"."+key]:
		d.bad[path+"."+key] = true
	default:
		d.fail(&Error{Path: path + "." + key, Rule: rule, Line: yamlnode.Resolve(n).Line})
	}
}

func (d *decoder) store(s *Store, n *yaml.Node) {
	m, ok := d.mapping("store", n, "type", "redis")
	if !ok {
		return
	}
	d.str("store.type", m["type"], &s.Type)
	v := m["redis"]
	if v == nil {
		return
	}
	const p = "store.redis"
	rm, ok := d.mapping(p, v, "url", "addrs", "mode", "master_name", "username", "password_env", "timeout", "dial_timeout", "pool_size", "wait_replicas")
	if !ok {
		return
	}
	r := &Redis{}
	d.str(p+".url", rm["url"], &r.URL)
	d.strs(p+".addrs", rm["addrs"], &r.Addrs)
	d.str(p+".mode", rm["mode"], &r.Mode)
	d.str(p+".master_name", rm["master_name"], &r.MasterName)
	d.str(p+".username", rm["username"], &r.Username)
	d.str(p+".password_env", rm["password_env"], &r.PasswordEnv)
	d.duration(p+".timeout", rm["timeout"], &r.Timeout)
	d.duration(p+".dial_timeout", rm["dial_timeout"], &r.DialTimeout)
	d.int(p+".pool_size", rm["pool_size"], &r.PoolSize)
	d.int(p+".wait_replicas", rm["wait_replicas"], &r.WaitReplicas)
	s.Redis = r
}

func (d *decoder) policies(n *yaml.Node) []Policy {
	items, ok := d.sequence("policies", n)
	if !ok {
		return nil
	}
	ps := make([]Policy, len(items))
	for i, item := range items {
		d.policy(fmt.Sprintf("policies[%d]", i), item, &ps[i])
	}
	return ps
}

func (d *decoder) policy(path string, n *yaml.Node, p *Policy) {
	m, ok := d.mapping(path, n, "id", "revision", "algorithm", "limit", "window", "lease_ttl", "burst", "max_cost", "failure_mode", "cleanup_grace", "dedupe_ttl", "dedupe_max", "near_cache", "align", "local_quota", "period", "time_zone", "priorities", "max_wait")
	if !ok {
		return
	}
	d.required(path, n, m, "id", "algorithm", "limit")
	// A concurrency policy has a lease_ttl and no window; the others a
	// window (sluice.Policy.Validate judges a window on concurrency or a
	// lease_ttl elsewhere).
	if a := m["algorithm"]; a != nil && a.Kind == yaml.ScalarNode && a.Value == sluice.Concurrency.String() {
		if m["window"] == nil {
			d.require(path, n, m, "lease_ttl", "is required for concurrency: how long a lease lives if never released, e.g. 30s")
		}
	} else if m["period"] == nil {
		d.require(path, n, m, "window", "is required (or a period: minute, hour, day, week, month, year)")
	}
	var algorithm, failureMode, align string
	var dedupeMax int64
	d.str(path+".id", m["id"], &p.ID)
	d.int(path+".revision", m["revision"], &p.Revision)
	d.str(path+".algorithm", m["algorithm"], &algorithm)
	d.int(path+".limit", m["limit"], &p.Limit)
	d.duration(path+".window", m["window"], &p.Window)
	d.duration(path+".lease_ttl", m["lease_ttl"], &p.LeaseTTL)
	d.int(path+".burst", m["burst"], &p.Burst)
	d.int(path+".max_cost", m["max_cost"], &p.MaxCost)
	d.str(path+".failure_mode", m["failure_mode"], &failureMode)
	d.duration(path+".cleanup_grace", m["cleanup_grace"], &p.CleanupGrace)
	d.duration(path+".dedupe_ttl", m["dedupe_ttl"], &p.DedupeTTL)
	d.int(path+".dedupe_max", m["dedupe_max"], &dedupeMax)
	d.bool(path+".near_cache", m["near_cache"], &p.NearCache)
	d.str(path+".align", m["align"], &align)
	d.localQuota(path+".local_quota", m["local_quota"], &p.LocalQuota)
	d.str(path+".period", m["period"], &p.Period)
	d.timeZone(path+".time_zone", m["time_zone"], &p.TimeZone)
	d.priorities(path+".priorities", m["priorities"], &p.Priorities)
	d.duration(path+".max_wait", m["max_wait"], &p.MaxWait)
	switch align {
	case "", "first_request":
	case "clock":
		p.ClockAligned = true
	default:
		d.fail(&Error{Path: path + ".align", Value: yamlnode.Written(m["align"]), Rule: "must be one of clock (windows start on the UTC boundaries of the window's length), first_request (the default: a window opens at its first admitted request)", Line: m["align"].Line})
	}
	if dedupeMax != int64(int(dedupeMax)) {
		d.fail(&Error{Path: path + ".dedupe_max", Value: yamlnode.Written(m["dedupe_max"]), Rule: "is out of range", Line: m["dedupe_max"].Line})
		dedupeMax = 0
	}
	p.DedupeMax = int(dedupeMax)
	// Spellings that name nothing are left as invalid values for
	// sluice.Policy.Validate to reject, so its rule text is the only one.
	var err error
	if p.Algorithm, err = ParseAlgorithm(algorithm); err != nil {
		p.Algorithm = sluice.Algorithm(math.MaxUint8)
	}
	if n := m["failure_mode"]; n != nil && !d.bad[path+".failure_mode"] {
		if p.FailureMode, err = parseFailureMode(failureMode); err != nil {
			d.fail(&Error{Path: path + ".failure_mode", Value: yamlnode.Written(n), Rule: "must be one of closed, open, local", Line: yamlnode.Resolve(n).Line})
		}
	}
	// An explicit 0 is a value the rules judge, not "use the default".
	for _, f := range [...]struct {
		key string
		v   int64
	}{{"revision", p.Revision}, {"burst", p.Burst}, {"max_cost", p.MaxCost}, {"dedupe_ttl", int64(p.DedupeTTL)}, {"dedupe_max", dedupeMax}, {"max_wait", int64(p.MaxWait)}} {
		if key := f.key; m[key] != nil && f.v == 0 && !d.bad[path+"."+key] {
			d.fail(&Error{Path: path + "." + key, Value: yamlnode.Written(m[key]), Rule: "must not be zero; leave it out for the default", Line: yamlnode.Resolve(m[key]).Line})
		}
	}
}

// priorities reads a policy's priorities: a mapping of priority class
// to the share of the policy's capacity it may use, in percent, written
// 50% or 50 (sluice.Policy.Validate judges names and numbers).
func (d *decoder) priorities(path string, n *yaml.Node, out *map[string]int) {
	if n == nil {
		return
	}
	m, ok := d.mapping(path, n, yamlnode.Keys(n)...) // the names are the policy's to choose
	if !ok {
		return
	}
	shares, errs := yamlnode.Shares(path, m)
	for _, e := range errs {
		d.fail(e)
	}
	*out = shares
}

// localQuota reads a policy's local_quota: true or false, or a mapping of
// its numbers (which turns it on).
func (d *decoder) localQuota(path string, n *yaml.Node, q *sluice.LocalQuota) {
	if n == nil {
		return
	}
	if yamlnode.Resolve(n).Kind != yaml.MappingNode {
		d.bool(path, n, &q.Enabled)
		return
	}
	m, ok := d.mapping(path, n, "block_time", "max_block")
	if !ok {
		return
	}
	q.Enabled = true
	d.duration(path+".block_time", m["block_time"], &q.BlockTime)
	d.int(path+".max_block", m["max_block"], &q.MaxBlock)
	for _, f := range [...]struct {
		key  string
		zero bool
	}{{"block_time", q.BlockTime == 0}, {"max_block", q.MaxBlock == 0}} {
		if key := f.key; m[key] != nil && f.zero && !d.bad[path+"."+key] {
			d.fail(&Error{Path: path + "." + key, Value: yamlnode.Written(m[key]), Rule: "must not be zero; leave it out for the default", Line: yamlnode.Resolve(m[key]).Line})
		}
	}
}

func (d *decoder) subjects(s *Subjects, n *yaml.Node) {
	m, ok := d.mapping("subjects", n, "hmac_keys")
	if !ok {
		return
	}
	v := m["hmac_keys"]
	if v == nil {
		return
	}
	items, ok := d.sequence("subjects.hmac_keys", v)
	if !ok {
		return
	}
	s.HMACKeys = make([]HMACKey, len(items))
	for i, item := range items {
		path := fmt.Sprintf("subjects.hmac_keys[%d]", i)
		km, ok := d.mapping(path, item, "id", "secret_env")
		if !ok {
			continue
		}
		d.required(path, item, km, "id", "secret_env")
		k := &s.HMACKeys[i]
		d.str(path+".id", km["id"], &k.ID)
		d.str(path+".secret_env", km["secret_env"], &k.SecretEnv)
	}
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

func (d *decoder) envoy(n *yaml.Node) *Envoy {
	m, ok := d.mapping("envoy", n, "listen", "configs", "local_quota", "max_descriptors", "max_entries", "response_metadata")
	if !ok {
		return nil
	}
	e := &Envoy{}
	d.str("envoy.listen", m["listen"], &e.Listen)
	d.strs("envoy.configs", m["configs"], &e.Configs)
	d.bool("envoy.local_quota", m["local_quota"], &e.LocalQuota)
	d.int("envoy.max_descriptors", m["max_descriptors"], &e.MaxDescriptors)
	d.int("envoy.max_entries", m["max_entries"], &e.MaxEntries)
	d.bool("envoy.response_metadata", m["response_metadata"], &e.ResponseMetadata)
	return e
}

// mapping checks that n is a mapping whose keys are all known, distinct
// strings, records it at path, and returns its values by key. An unknown
// or repeated key is recorded and left out; ok is false when n is not a
// mapping at all.
func (d *decoder) mapping(path string, n *yaml.Node, known ...string) (m map[string]*yaml.Node, ok bool) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.MappingNode {
		rule := fmt.Sprintf("must be a mapping, not %s", yamlnode.KindName(n))
		if path == "" {
			rule = "the config " + rule
		}
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: rule, Line: n.Line})
		return nil, false
	}
	if _, known := d.pos[path]; !known && path != "" {
		d.pos[path] = position{line: n.Line}
	}
	m = make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := yamlnode.Resolve(n.Content[i])
		switch {
		case k.Kind != yaml.ScalarNode || k.Tag == "!!merge":
			d.fail(&Error{Path: path, Value: yamlnode.Written(k), Rule: "keys must be plain names; merge keys (<<) and complex keys are not supported", Line: k.Line})
			continue
		case k.Tag != "!!str" || !contains(known, k.Value):
			rule := "unknown key: must be one of " + strings.Join(known, ", ")
			if near := Closest(k.Value, known); near != "" {
				rule += fmt.Sprintf(" (did you mean %s?)", near)
				d.misspelt[yamlnode.Join(path, near)] = true
			}
			d.errs = append(d.errs, &Error{Path: yamlnode.Join(path, k.Value), Rule: rule, Line: k.Line})
			continue
		}
		if _, dup := m[k.Value]; dup {
			d.errs = append(d.errs, &Error{Path: yamlnode.Join(path, k.Value), Rule: fmt.Sprintf("is set twice (first at line %d)", d.pos[yamlnode.Join(path, k.Value)].line), Line: k.Line})
			continue
		}
		v := yamlnode.Resolve(n.Content[i+1])
		m[k.Value] = v
		d.pos[yamlnode.Join(path, k.Value)] = position{line: k.Line, value: yamlnode.Written(v)}
	}
	return m, true
}

// Closest returns the one of names nearest to s when it is near enough to
// be a misspelling (at most a third of its letters differ), else "".
func Closest(s string, names []string) string {
	best, bestD := "", len(s)/3+1
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the distance between a and b in single-byte edits
// (insert, delete, replace, swap two neighbours: "burts" is 1 from
// "burst").
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sequence checks that n is a list and returns its items; ok is false,
// and the error recorded, when it is not.
func (d *decoder) sequence(path string, n *yaml.Node) (items []*yaml.Node, ok bool) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: fmt.Sprintf("must be a list, not %s", yamlnode.KindName(n)), Line: n.Line})
		return nil, false
	}
	items = make([]*yaml.Node, len(n.Content))
	for i, item := range n.Content {
		item = yamlnode.Resolve(item)
		items[i] = item
		d.pos[fmt.Sprintf("%s[%d]", path, i)] = position{line: item.Line, value: yamlnode.Written(item)}
	}
	return items, true
}

// scalar checks that n is a scalar of one of the tags.
func scalar(path string, n *yaml.Node, want string, tags ...string) *Error {
	if n.Kind == yaml.ScalarNode && contains(tags, n.Tag) {
		return nil
	}
	what := yamlnode.KindName(n)
	if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
		what = strings.TrimPrefix(n.Tag, "!!")
		switch what {
		case "str":
			what = "a string"
		case "int":
			what = "an integer"
		default:
			what = "a " + what
		}
	}
	return &Error{Path: path, Value: yamlnode.Written(n), Rule: fmt.Sprintf("must be %s, not %s", want, what), Line: n.Line}
}

// str decodes a string at path into *out; a nil n leaves *out alone.
// Like every decoding function it records what does not decode.
func (d *decoder) str(path string, n *yaml.Node, out *string) {
	if n == nil {
		return
	}
	if err := scalar(path, n, "a string", "!!str"); err != nil {
		if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
			err.Rule += "; quote it"
		}
		d.fail(err)
		return
	}
	*out = n.Value
}

// timeZone decodes an IANA time zone name, e.g. Europe/Berlin or UTC.
func (d *decoder) timeZone(path string, n *yaml.Node, out **time.Location) {
	var name string
	if d.str(path, n, &name); name == "" {
		return
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "Local" {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: "must be an IANA time zone name such as Europe/Berlin, America/New_York or UTC", Line: n.Line})
		return
	}
	*out = loc
}

// strs decodes a list of strings.
func (d *decoder) strs(path string, n *yaml.Node, out *[]string) {
	if n == nil {
		return
	}
	items, ok := d.sequence(path, n)
	if !ok {
		return
	}
	s := make([]string, len(items))
	for i, item := range items {
		d.str(fmt.Sprintf("%s[%d]", path, i), item, &s[i])
	}
	*out = s
}

func (d *decoder) int(path string, n *yaml.Node, out *int64) {
	if n == nil {
		return
	}
	if err := scalar(path, n, "an integer", "!!int"); err != nil {
		d.fail(err)
		return
	}
	if err := n.Decode(out); err != nil {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: "must be an integer that fits in 64 bits", Line: n.Line})
	}
}

// float decodes a number; an integer such as 1 is a number too.
func (d *decoder) float(path string, n *yaml.Node, out *float64) {
	if n == nil {
		return
	}
	if err := scalar(path, n, "a number", "!!float", "!!int"); err != nil {
		d.fail(err)
		return
	}
	if err := n.Decode(out); err != nil {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: "must be a number", Line: n.Line})
	}
}

func (d *decoder) bool(path string, n *yaml.Node, out *bool) {
	if n == nil {
		return
	}
	if err := scalar(path, n, "true or false", "!!bool"); err != nil {
		d.fail(err)
		return
	}
	if err := n.Decode(out); err != nil {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: "must be true or false", Line: n.Line})
	}
}

func (d *decoder) duration(path string, n *yaml.Node, out *time.Duration) {
	if n == nil {
		return
	}
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float") {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: "must be a duration with a unit, such as 10s, 1m or 1h30m", Line: n.Line})
		return
	}
	if err := scalar(path, n, "a duration such as 10s, 1m or 1h30m", "!!str"); err != nil {
		d.fail(err)
		return
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: "must be a duration such as 10s, 1m or 1h30m", Line: n.Line})
		return
	}
	*out = v
}

// ParseAlgorithm maps an algorithm's config spelling to the Algorithm,
// e.g. "token_bucket" to sluice.TokenBucket.
func ParseAlgorithm(s string) (sluice.Algorithm, error) {
	for a := sluice.FixedWindow; a <= sluice.Concurrency; a++ {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q: must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency", s)
}

// parseFailureMode maps a failure mode's config spelling to the
// FailureMode, e.g. "local" to failure.Local.
func parseFailureMode(s string) (failure.Mode, error) {
	for m := failure.Closed; m <= failure.Local; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown failure mode %q: must be one of closed, open, local", s)
}
