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

	"github.com/sluicehq/sluice"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/yamlnode"
)

// MaxSize is the largest config Parse reads, in bytes.
const MaxSize = 1 << 20

// Parse reads one YAML document from r, decodes it strictly, fills in the
// defaults of absent keys and validates it. Every error is an *Error with
// the line it was found on, or Errors when there are several. When the
// document decodes but breaks rules, Parse returns the decoded Config
// with the error, so that a tool can report more (sluice validate checks
// the environment too); such a Config must not be served.
func Parse(r io.Reader) (c *Config, err error) {
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
	d := &decoder{pos: map[string]position{}}
	c, err = d.config(root)
	if err != nil {
		return nil, err
	}
	c.pos = d.pos
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
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
		return nil, &Error{Rule: "the config is empty: at least one policy is required"}
	case err != nil:
		e := &Error{Rule: "invalid YAML: " + err.Error()}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			e.Rule = "invalid YAML: " + m[2]
			e.Line, _ = strconv.Atoi(m[1])
		}
		return nil, e
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, &Error{Rule: "only one YAML document is allowed", Line: next.Line}
	}
	if len(doc.Content) == 0 {
		return nil, &Error{Rule: "the config is empty: at least one policy is required"}
	}
	return doc.Content[0], nil
}

// decoder walks the node tree, recording where each value was written.
type decoder struct {
	pos map[string]position
}

func (d *decoder) config(n *yaml.Node) (*Config, error) {
	n = yamlnode.Resolve(n)
	if n.Tag == "!!null" {
		return nil, &Error{Rule: "the config is empty: at least one policy is required", Line: n.Line}
	}
	c := &Config{Server: Server{Listen: DefaultListen, DecisionTimeout: DefaultDecisionTimeout}, Store: Store{Type: StoreMemory}}
	m, err := d.mapping("", n, "server", "store", "policies", "subjects", "proxy", "envoy", "telemetry")
	if err != nil {
		return nil, err
	}
	// Each section is decoded even when another one failed, so that one
	// run reports every error it can find.
	var errs []error
	if v := m["server"]; v != nil {
		errs = append(errs, d.server(&c.Server, v))
	}
	if v := m["store"]; v != nil {
		errs = append(errs, d.store(&c.Store, v))
	}
	if v := m["policies"]; v != nil {
		c.Policies, err = d.policies(v)
		errs = append(errs, err)
	}
	if v := m["subjects"]; v != nil {
		errs = append(errs, d.subjects(&c.Subjects, v))
	}
	if v := m["proxy"]; v != nil {
		c.Proxy, err = d.proxy(v)
		errs = append(errs, err)
	}
	if v := m["envoy"]; v != nil {
		c.Envoy, err = d.envoy(v)
		errs = append(errs, err)
	}
	if v := m["telemetry"]; v != nil {
		c.Telemetry, err = d.telemetry(v)
		errs = append(errs, err)
	}
	if err := collect(errs); err != nil {
		return nil, err
	}
	return c, nil
}

// collect flattens decoding errors (each an *Error or Errors) into one
// error as joinErrors does; nil when there are none.
func collect(errs []error) error {
	var all []*Error
	for _, err := range errs {
		var es Errors
		var e *Error
		switch {
		case err == nil:
		case errors.As(err, &es):
			all = append(all, es...)
		case errors.As(err, &e):
			all = append(all, e)
		default:
			all = append(all, &Error{Rule: err.Error()})
		}
	}
	return joinErrors(all)
}

func (d *decoder) server(s *Server, n *yaml.Node) error {
	m, err := d.mapping("server", n, "listen", "tls", "auth", "decision_timeout")
	if err != nil {
		return err
	}
	if err := d.str("server.listen", m["listen"], &s.Listen); err != nil {
		return err
	}
	if err := d.duration("server.decision_timeout", m["decision_timeout"], &s.DecisionTimeout); err != nil {
		return err
	}
	if v := m["tls"]; v != nil {
		tm, err := d.mapping("server.tls", v, "cert_file", "key_file")
		if err != nil {
			return err
		}
		s.TLS = &TLS{}
		if err := collect([]error{
			d.str("server.tls.cert_file", tm["cert_file"], &s.TLS.CertFile),
			d.str("server.tls.key_file", tm["key_file"], &s.TLS.KeyFile),
		}); err != nil {
			return err
		}
	}
	v := m["auth"]
	if v == nil {
		return nil
	}
	am, err := d.mapping("server.auth", v, "tokens")
	if err != nil {
		return err
	}
	s.Auth = &Auth{}
	if am["tokens"] == nil {
		return nil
	}
	items, err := d.sequence("server.auth.tokens", am["tokens"])
	if err != nil {
		return err
	}
	s.Auth.Tokens = make([]Token, len(items))
	var errs []error
	for i, item := range items {
		errs = append(errs, d.token(fmt.Sprintf("server.auth.tokens[%d]", i), item, &s.Auth.Tokens[i]))
	}
	return collect(errs)
}

func (d *decoder) token(path string, n *yaml.Node, t *Token) error {
	m, err := d.mapping(path, n, "id", "secret_env", "scopes")
	if err != nil {
		return err
	}
	for _, key := range [...]string{"id", "secret_env", "scopes"} {
		if m[key] == nil {
			return &Error{Path: path + "." + key, Rule: "is required", Line: yamlnode.Resolve(n).Line}
		}
	}
	return collect([]error{
		d.str(path+".id", m["id"], &t.ID),
		d.str(path+".secret_env", m["secret_env"], &t.SecretEnv),
		d.strs(path+".scopes", m["scopes"], &t.Scopes),
	})
}

func (d *decoder) store(s *Store, n *yaml.Node) error {
	m, err := d.mapping("store", n, "type", "redis")
	if err != nil {
		return err
	}
	if err := d.str("store.type", m["type"], &s.Type); err != nil {
		return err
	}
	v := m["redis"]
	if v == nil {
		return nil
	}
	const p = "store.redis"
	rm, err := d.mapping(p, v, "url", "addrs", "mode", "master_name", "username", "password_env", "timeout", "dial_timeout", "pool_size", "wait_replicas")
	if err != nil {
		return err
	}
	r := &Redis{}
	if err := collect([]error{
		d.str(p+".url", rm["url"], &r.URL),
		d.strs(p+".addrs", rm["addrs"], &r.Addrs),
		d.str(p+".mode", rm["mode"], &r.Mode),
		d.str(p+".master_name", rm["master_name"], &r.MasterName),
		d.str(p+".username", rm["username"], &r.Username),
		d.str(p+".password_env", rm["password_env"], &r.PasswordEnv),
		d.duration(p+".timeout", rm["timeout"], &r.Timeout),
		d.duration(p+".dial_timeout", rm["dial_timeout"], &r.DialTimeout),
		d.int(p+".pool_size", rm["pool_size"], &r.PoolSize),
		d.int(p+".wait_replicas", rm["wait_replicas"], &r.WaitReplicas),
	}); err != nil {
		return err
	}
	s.Redis = r
	return nil
}

func (d *decoder) policies(n *yaml.Node) ([]Policy, error) {
	items, err := d.sequence("policies", n)
	if err != nil {
		return nil, err
	}
	ps := make([]Policy, len(items))
	errs := make([]error, len(items))
	for i, item := range items {
		errs[i] = d.policy(fmt.Sprintf("policies[%d]", i), item, &ps[i])
	}
	if err := collect(errs); err != nil {
		return nil, err
	}
	return ps, nil
}

func (d *decoder) policy(path string, n *yaml.Node, p *Policy) error {
	m, err := d.mapping(path, n, "id", "revision", "algorithm", "limit", "window", "lease_ttl", "burst", "max_cost", "failure_mode", "cleanup_grace", "dedupe_ttl", "dedupe_max", "near_cache")
	if err != nil {
		return err
	}
	for _, key := range [...]string{"id", "algorithm", "limit"} {
		if m[key] == nil {
			return &Error{Path: path + "." + key, Rule: "is required", Line: yamlnode.Resolve(n).Line}
		}
	}
	// A concurrency policy has a lease_ttl and no window; the others a
	// window (sluice.Policy.Validate judges a window on concurrency or a
	// lease_ttl elsewhere).
	if a := m["algorithm"]; a.Kind == yaml.ScalarNode && a.Value == sluice.Concurrency.String() {
		if m["lease_ttl"] == nil && m["window"] == nil {
			return &Error{Path: path + ".lease_ttl", Rule: "is required for concurrency: how long a lease lives if never released, e.g. 30s", Line: yamlnode.Resolve(n).Line}
		}
	} else if m["window"] == nil {
		return &Error{Path: path + ".window", Rule: "is required", Line: yamlnode.Resolve(n).Line}
	}
	var algorithm, failureMode string
	var dedupeMax int64
	if err := collect([]error{
		d.str(path+".id", m["id"], &p.ID),
		d.int(path+".revision", m["revision"], &p.Revision),
		d.str(path+".algorithm", m["algorithm"], &algorithm),
		d.int(path+".limit", m["limit"], &p.Limit),
		d.duration(path+".window", m["window"], &p.Window),
		d.duration(path+".lease_ttl", m["lease_ttl"], &p.LeaseTTL),
		d.int(path+".burst", m["burst"], &p.Burst),
		d.int(path+".max_cost", m["max_cost"], &p.MaxCost),
		d.str(path+".failure_mode", m["failure_mode"], &failureMode),
		d.duration(path+".cleanup_grace", m["cleanup_grace"], &p.CleanupGrace),
		d.duration(path+".dedupe_ttl", m["dedupe_ttl"], &p.DedupeTTL),
		d.int(path+".dedupe_max", m["dedupe_max"], &dedupeMax),
		d.bool(path+".near_cache", m["near_cache"], &p.NearCache),
	}); err != nil {
		return err
	}
	if dedupeMax != int64(int(dedupeMax)) {
		return &Error{Path: path + ".dedupe_max", Value: yamlnode.Written(m["dedupe_max"]), Rule: "is out of range", Line: m["dedupe_max"].Line}
	}
	p.DedupeMax = int(dedupeMax)
	// Spellings that name nothing are left as invalid values for
	// sluice.Policy.Validate to reject, so its rule text is the only one.
	if p.Algorithm, err = ParseAlgorithm(algorithm); err != nil {
		p.Algorithm = sluice.Algorithm(math.MaxUint8)
	}
	if m["failure_mode"] != nil {
		if p.FailureMode, err = parseFailureMode(failureMode); err != nil {
			p.FailureMode = sluice.FailureMode(math.MaxUint8)
		}
	}
	// An explicit 0 is a value the rules judge, not "use the default".
	for _, f := range [...]struct {
		key string
		v   int64
	}{{"revision", p.Revision}, {"burst", p.Burst}, {"max_cost", p.MaxCost}, {"dedupe_ttl", int64(p.DedupeTTL)}, {"dedupe_max", dedupeMax}} {
		if key := f.key; m[key] != nil && f.v == 0 {
			return &Error{Path: path + "." + key, Value: yamlnode.Written(m[key]), Rule: "must not be zero; leave it out for the default", Line: yamlnode.Resolve(m[key]).Line}
		}
	}
	return nil
}

func (d *decoder) subjects(s *Subjects, n *yaml.Node) error {
	m, err := d.mapping("subjects", n, "hmac_keys")
	if err != nil {
		return err
	}
	v := m["hmac_keys"]
	if v == nil {
		return nil
	}
	items, err := d.sequence("subjects.hmac_keys", v)
	if err != nil {
		return err
	}
	s.HMACKeys = make([]HMACKey, len(items))
	for i, item := range items {
		path := fmt.Sprintf("subjects.hmac_keys[%d]", i)
		km, err := d.mapping(path, item, "id", "secret_env")
		if err != nil {
			return err
		}
		for _, key := range [...]string{"id", "secret_env"} {
			if km[key] == nil {
				return &Error{Path: path + "." + key, Rule: "is required", Line: yamlnode.Resolve(item).Line}
			}
		}
		k := &s.HMACKeys[i]
		if err := d.str(path+".id", km["id"], &k.ID); err != nil {
			return err
		}
		if err := d.str(path+".secret_env", km["secret_env"], &k.SecretEnv); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) proxy(n *yaml.Node) (*Proxy, error) {
	m, err := d.mapping("proxy", n, "listen", "upstream", "trusted_proxies", "routes", "local_share", "decision_timeout", "read_timeout")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Listen: DefaultProxyListen, LocalShare: DefaultLocalShare, DecisionTimeout: DefaultDecisionTimeout, ReadTimeout: DefaultProxyReadTimeout}
	if err := d.str("proxy.listen", m["listen"], &p.Listen); err != nil {
		return nil, err
	}
	if err := d.str("proxy.upstream", m["upstream"], &p.Upstream); err != nil {
		return nil, err
	}
	if err := d.float("proxy.local_share", m["local_share"], &p.LocalShare); err != nil {
		return nil, err
	}
	if err := d.duration("proxy.decision_timeout", m["decision_timeout"], &p.DecisionTimeout); err != nil {
		return nil, err
	}
	if err := d.duration("proxy.read_timeout", m["read_timeout"], &p.ReadTimeout); err != nil {
		return nil, err
	}
	if err := d.strs("proxy.trusted_proxies", m["trusted_proxies"], &p.TrustedProxies); err != nil {
		return nil, err
	}
	if v := m["routes"]; v != nil {
		items, err := d.sequence("proxy.routes", v)
		if err != nil {
			return nil, err
		}
		p.Routes = make([]Route, len(items))
		errs := make([]error, len(items))
		for i, item := range items {
			errs[i] = d.route(fmt.Sprintf("proxy.routes[%d]", i), item, &p.Routes[i])
		}
		if err := collect(errs); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (d *decoder) route(path string, n *yaml.Node, r *Route) error {
	m, err := d.mapping(path, n, "match", "policies", "subject", "shadow")
	if err != nil {
		return err
	}
	if m["match"] == nil {
		return &Error{Path: path + ".match", Rule: "is required", Line: yamlnode.Resolve(n).Line}
	}
	mm, err := d.mapping(path+".match", m["match"], "path_prefix", "methods")
	if err != nil {
		return err
	}
	r.Subject = "ip"
	if err := collect([]error{
		d.str(path+".match.path_prefix", mm["path_prefix"], &r.Match.PathPrefix),
		d.strs(path+".match.methods", mm["methods"], &r.Match.Methods),
		d.strs(path+".policies", m["policies"], &r.Policies),
		d.str(path+".subject", m["subject"], &r.Subject),
		d.bool(path+".shadow", m["shadow"], &r.Shadow),
	}); err != nil {
		return err
	}
	return nil
}

func (d *decoder) envoy(n *yaml.Node) (*Envoy, error) {
	m, err := d.mapping("envoy", n, "listen", "configs")
	if err != nil {
		return nil, err
	}
	e := &Envoy{}
	if err := d.str("envoy.listen", m["listen"], &e.Listen); err != nil {
		return nil, err
	}
	if err := d.strs("envoy.configs", m["configs"], &e.Configs); err != nil {
		return nil, err
	}
	return e, nil
}

// mapping checks that n is a mapping whose keys are all known, distinct
// strings, records it at path, and returns its values by key.
func (d *decoder) mapping(path string, n *yaml.Node, known ...string) (map[string]*yaml.Node, error) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.MappingNode {
		rule := fmt.Sprintf("must be a mapping, not %s", yamlnode.KindName(n))
		if path == "" {
			rule = "the config " + rule
		}
		return nil, &Error{Path: path, Value: yamlnode.Written(n), Rule: rule, Line: n.Line}
	}
	if _, known := d.pos[path]; !known && path != "" {
		d.pos[path] = position{line: n.Line}
	}
	m := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := yamlnode.Resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
			return nil, &Error{Path: path, Value: yamlnode.Written(k), Rule: "keys must be plain names; merge keys (<<) and complex keys are not supported", Line: k.Line}
		}
		if k.Tag != "!!str" {
			return nil, &Error{Path: yamlnode.Join(path, k.Value), Rule: "unknown key: must be one of " + strings.Join(known, ", "), Line: k.Line}
		}
		if !contains(known, k.Value) {
			return nil, &Error{Path: yamlnode.Join(path, k.Value), Rule: "unknown key: must be one of " + strings.Join(known, ", "), Line: k.Line}
		}
		if _, dup := m[k.Value]; dup {
			return nil, &Error{Path: yamlnode.Join(path, k.Value), Rule: fmt.Sprintf("is set twice (first at line %d)", d.pos[yamlnode.Join(path, k.Value)].line), Line: k.Line}
		}
		v := yamlnode.Resolve(n.Content[i+1])
		m[k.Value] = v
		d.pos[yamlnode.Join(path, k.Value)] = position{line: k.Line, value: yamlnode.Written(v)}
	}
	return m, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sequence checks that n is a list and returns its items.
func (d *decoder) sequence(path string, n *yaml.Node) ([]*yaml.Node, error) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		return nil, &Error{Path: path, Value: yamlnode.Written(n), Rule: fmt.Sprintf("must be a list, not %s", yamlnode.KindName(n)), Line: n.Line}
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, item := range n.Content {
		item = yamlnode.Resolve(item)
		items[i] = item
		d.pos[fmt.Sprintf("%s[%d]", path, i)] = position{line: item.Line, value: yamlnode.Written(item)}
	}
	return items, nil
}

// scalar checks that n is a scalar of one of the tags.
func scalar(path string, n *yaml.Node, want string, tags ...string) error {
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
func (d *decoder) str(path string, n *yaml.Node, out *string) error {
	if n == nil {
		return nil
	}
	if err := scalar(path, n, "a string", "!!str"); err != nil {
		if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
			err.(*Error).Rule += "; quote it"
		}
		return err
	}
	*out = n.Value
	return nil
}

// strs decodes a list of strings.
func (d *decoder) strs(path string, n *yaml.Node, out *[]string) error {
	if n == nil {
		return nil
	}
	items, err := d.sequence(path, n)
	if err != nil {
		return err
	}
	s := make([]string, len(items))
	for i, item := range items {
		if err := d.str(fmt.Sprintf("%s[%d]", path, i), item, &s[i]); err != nil {
			return err
		}
	}
	*out = s
	return nil
}

func (d *decoder) int(path string, n *yaml.Node, out *int64) error {
	if n == nil {
		return nil
	}
	if err := scalar(path, n, "an integer", "!!int"); err != nil {
		return err
	}
	if err := n.Decode(out); err != nil {
		return &Error{Path: path, Value: yamlnode.Written(n), Rule: "must be an integer that fits in 64 bits", Line: n.Line}
	}
	return nil
}

// float decodes a number; an integer such as 1 is a number too.
func (d *decoder) float(path string, n *yaml.Node, out *float64) error {
	if n == nil {
		return nil
	}
	if err := scalar(path, n, "a number", "!!float", "!!int"); err != nil {
		return err
	}
	if err := n.Decode(out); err != nil {
		return &Error{Path: path, Value: yamlnode.Written(n), Rule: "must be a number", Line: n.Line}
	}
	return nil
}

func (d *decoder) bool(path string, n *yaml.Node, out *bool) error {
	if n == nil {
		return nil
	}
	if err := scalar(path, n, "true or false", "!!bool"); err != nil {
		return err
	}
	return n.Decode(out)
}

func (d *decoder) duration(path string, n *yaml.Node, out *time.Duration) error {
	if n == nil {
		return nil
	}
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float") {
		return &Error{Path: path, Value: yamlnode.Written(n), Rule: "must be a duration with a unit, such as 10s, 1m or 1h30m", Line: n.Line}
	}
	if err := scalar(path, n, "a duration such as 10s, 1m or 1h30m", "!!str"); err != nil {
		return err
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return &Error{Path: path, Value: yamlnode.Written(n), Rule: "must be a duration such as 10s, 1m or 1h30m", Line: n.Line}
	}
	*out = v
	return nil
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
// FailureMode, e.g. "local" to sluice.FailLocal.
func parseFailureMode(s string) (sluice.FailureMode, error) {
	for m := sluice.FailClosed; m <= sluice.FailLocal; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown failure mode %q: must be one of closed, open, local", s)
}
