// Package envoyconf reads rate-limit rules written in envoyproxy/ratelimit's
// file format and matches Envoy rate-limit descriptors against them.
//
// A file holds one domain and a tree of descriptors:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit: { unit: day, requests_per_unit: 5 }
//	  - key: to_number
//	    rate_limit: { unit: day, requests_per_unit: 100 }
//
// Each descriptor has a key and optionally a value. A "*" in a value
// matches zero or more bytes, anywhere and as often as written
// ("value*", "/api/*/action", "/api/*/resource/*/action"), as
// envoyproxy/ratelimit's matcher does. share_threshold: true on a
// descriptor whose value has a "*" makes every value the wildcard matches
// spend one counter, instead of one per value. A descriptor with a
// rate_limit block is a rule: rate_limit holds unit (second, minute, hour
// or day) and requests_per_unit, or unlimited: true; optionally name and
// replaces (a list of {name: …}). shadow_mode: true reports a rule's
// verdict but never enforces it. detailed_metric and value_to_metric
// shape envoyproxy/ratelimit's statistics with descriptor values: they
// are accepted, checked and have no effect, since sluice never labels a
// metric with a descriptor value. metadata (sent back by
// envoyproxy/ratelimit only with RESPONSE_DYNAMIC_METADATA) is accepted
// and not sent. quota_mode is refused: it answers OK when some but not all
// quota descriptors are over their limits, which sluice's all-or-nothing
// decision does not do.
//
// sluice adds four optional keys to rate_limit: algorithm (default
// fixed_window), burst (token_bucket and gcra), failure_mode (closed,
// the default, or open) and align (fixed_window only: clock, the
// default, starts windows on the UTC second, minute, hour or day as
// envoyproxy/ratelimit does; first_request opens a window at its first
// admitted request, sluice's own default elsewhere).
//
// Matching follows envoyproxy/ratelimit: a request descriptor's entries are
// walked level by level, and at each level the most specific descriptor
// wins: the exact key and value, else the first wildcard value that
// matches (in file order), else the key alone. A rule applies only when the request has as many
// entries as the rule is deep.
//
// Each rule with a limit becomes a sluice.Policy whose ID is derived from
// its domain and path (see Rule.Policy), a fixed window aligned to the
// clock as theirs; the values matched by a key alone or a wildcard
// (without share_threshold) are the subject (see Match).
package envoyconf

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/policyerr"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server/config"
	"github.com/sluicehq/sluice/internal/yamlnode"
)

// MaxFileSize is the largest rules file Load reads, in bytes.
const MaxFileSize = 1 << 20

// Error is a rules file that breaks a rule. Its message reads
// "file: path: value: rule (line N)", leaving out what is unknown, e.g.
//
//	ratelimit/api.yaml: descriptors[0].rate_limit.unit: "fortnight": must be one of second, minute, hour, day (line 6)
type Error = yamlnode.Error

// Unit is a rate_limit unit. Its String form is the file spelling.
type Unit uint8

// Units. Their numbers are those of envoy.service.ratelimit.v3's
// RateLimitResponse.RateLimit.Unit, so a Unit converts to it directly.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
)

var units = map[string]Unit{"second": Second, "minute": Minute, "hour": Hour, "day": Day}

// String returns the file spelling, e.g. "minute".
func (u Unit) String() string {
	for name, v := range units {
		if v == u {
			return name
		}
	}
	return fmt.Sprintf("Unit(%d)", uint8(u))
}

// Duration is the length of one unit.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	}
	return 0
}

// Rule is one descriptor with a rate_limit block.
type Rule struct {
	// Domain is the domain of the file the rule is in.
	Domain string
	// Key is the rule's full key as envoyproxy/ratelimit names it: the
	// domain and every level's key, or key_value, joined by dots, e.g.
	// "messaging.message_type_marketing.to_number".
	Key string
	// Name is rate_limit.name, the handle replaces refers to; may be "".
	Name string
	// Replaces are the names of the rules this one replaces when both
	// apply to one request.
	Replaces []string
	// Unlimited rules are answered OK without asking the store.
	Unlimited bool
	// Shadow rules are decided and counted but always answered OK.
	Shadow bool
	// DetailedMetric and ValueToMetric are accepted for compatibility:
	// they put descriptor values in envoyproxy/ratelimit's statistics,
	// and sluice never labels a metric with one, so they have no effect.
	DetailedMetric bool
	ValueToMetric  bool
	// RequestsPerUnit and Unit are the limit; 0 requests per unit denies
	// every request without asking the store. Zero for unlimited rules.
	RequestsPerUnit int64
	Unit            Unit
	// Policy is the sluice policy that decides the rule; its ID is zero
	// for unlimited rules and rules of 0 requests per unit, which need
	// no store.
	Policy sluice.Policy
	// FailureMode is rate_limit.failure_mode: what the service answers
	// when the store cannot decide the rule (closed, the default, or
	// open).
	FailureMode failure.Mode
	// File and Line say where the rule is written.
	File string
	Line int
}

// Decided reports whether the store decides r (it has a Policy).
func (r *Rule) Decided() bool { return r.Policy.ID != "" }

// Config is a loaded set of rules files: one tree per domain. Build one
// with Load or Parse; it is immutable and safe for concurrent use.
type Config struct {
	domains map[string]*node
	rules   []*Rule
	files   []string
	hash    string
}

// node is one level of a domain's descriptor tree.
type node struct {
	rule     *Rule
	exact    map[entry]*node
	wildcard []wildcardNode // in file order
	keyOnly  map[string]*node
	has      int // number of children
}

type entry struct{ key, value string }

// wildcardNode is a descriptor whose value holds a "*": parts is the
// value split at every "*".
type wildcardNode struct {
	key, value string
	parts      []string
	shared     bool // share_threshold: every matching value is one counter
	n          *node
}

// wildcardMatch reports whether value matches the pattern split into
// parts at its "*"s (at least two parts): it starts with the first, ends
// with the last, and holds the others in order between them, each "*"
// standing for zero or more bytes. Taking each middle part at its first
// place is as good as any: a later one leaves less room for the rest.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

func newNode() *node { return &node{exact: map[entry]*node{}, keyOnly: map[string]*node{}} }

// Domains returns the domains, sorted.
func (c *Config) Domains() []string {
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	return ds
}

// HasDomain reports whether a file holds domain.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }

// Rules returns every rule in load order (files sorted by name, then
// file order).
func (c *Config) Rules() []*Rule { return c.rules }

// Files returns the files loaded, sorted.
func (c *Config) Files() []string { return c.files }

// Hash is the SHA-256 of the files' names and contents, in hex.
func (c *Config) Hash() string { return c.hash }

// Policies returns the policies of the rules the store decides.
func (c *Config) Policies() []sluice.Policy {
	var ps []sluice.Policy
	for _, r := range c.rules {
		if r.Decided() {
			ps = append(ps, r.Policy)
		}
	}
	return ps
}

// Entry is one key/value pair of a request descriptor.
type Entry struct{ Key, Value string }

// Match returns the rule that applies to a request descriptor of domain,
// or nil, and the entries whose values the rule does not fix (matched by
// a key alone or by a wildcard without share_threshold): the part of the
// descriptor that names whose budget is spent.
func (c *Config) Match(domain string, entries []Entry) (*Rule, []Entry) {
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil, nil
	}
	var vars []Entry
	for i, e := range entries {
		next, variable := n.lookup(e)
		if next == nil {
			return nil, nil
		}
		if variable {
			vars = append(vars, e)
		}
		if i == len(entries)-1 {
			return next.rule, vars
		}
		if next.has == 0 {
			return nil, nil // the request is deeper than the tree
		}
		n = next
	}
	return nil, nil
}

// lookup finds the most specific child of n for e; variable reports
// whether e's value names whose budget is spent.
func (n *node) lookup(e Entry) (next *node, variable bool) {
	if next := n.exact[entry{e.Key, e.Value}]; next != nil {
		return next, false
	}
	for _, w := range n.wildcard {
		if w.key == e.Key && wildcardMatch(w.parts, e.Value) {
			return w.n, !w.shared
		}
	}
	if next := n.keyOnly[e.Key]; next != nil {
		return next, true
	}
	return nil, false
}

// Load reads the files that patterns (filepath.Glob patterns) match, in
// sorted order, each name once. A pattern that matches nothing is fine as
// long as some pattern matches a file. Errors are *Error naming the file.
func Load(patterns []string) (*Config, error) {
	seen := map[string]bool{}
	var files []string
	for _, pat := range patterns {
		ms, err := filepath.Glob(pat)
		if err != nil {
			return nil, &Error{File: pat, Rule: "is not a valid glob pattern"}
		}
		for _, m := range ms {
			if fi, err := os.Stat(m); err == nil && fi.IsDir() {
				continue
			}
			if !seen[m] {
				seen[m] = true
				files = append(files, m)
			}
		}
	}
	if len(files) == 0 {
		return nil, &Error{File: strings.Join(patterns, ", "), Rule: "no rules file matches"}
	}
	sort.Strings(files)
	srcs := make([]Source, len(files))
	for i, f := range files {
		data, err := readFile(f)
		if err != nil {
			return nil, err
		}
		srcs[i] = Source{Name: f, Data: data}
	}
	return Parse(srcs)
}

func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, &Error{File: name, Rule: "cannot be read: " + errors.Unwrap(err).Error()}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, &Error{File: name, Rule: "cannot be read: " + err.Error()}
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: name, Rule: fmt.Sprintf("is larger than %d bytes", MaxFileSize)}
	}
	return data, nil
}

// Source is one rules file's name and content.
type Source struct {
	Name string
	Data []byte
}

// Parse builds a Config from files' contents, in the order given. Two
// files may not hold the same domain.
func Parse(files []Source) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	domainFile := map[string]string{}
	ids := map[string]*Rule{}
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
		c.files = append(c.files, f.Name)
		p := &parser{file: f.Name}
		domain, root, line, err := p.parse(f.Data)
		if err != nil {
			return nil, err
		}
		if prev, dup := domainFile[domain]; dup {
			return nil, &Error{File: f.Name, Path: "domain", Value: strconv.Quote(domain), Rule: "is already the domain of " + prev + ": each domain lives in one file", Line: line}
		}
		domainFile[domain] = f.Name
		c.domains[domain] = root
		for _, r := range p.rules {
			if !r.Decided() {
				continue
			}
			if other, dup := ids[r.Policy.ID]; dup {
				return nil, &Error{File: r.File, Rule: fmt.Sprintf("rule %s has policy id %q, as has rule %s in %s (line %d); rename a key", r.Key, r.Policy.ID, other.Key, other.File, other.Line), Line: r.Line}
			}
			ids[r.Policy.ID] = r
		}
		c.rules = append(c.rules, p.rules...)
	}
	c.hash = hex.EncodeToString(h.Sum(nil))
	return c, nil
}

// parser reads one file.
type parser struct {
	file  string
	rules []*Rule
}

func (p *parser) errorf(path string, n *yaml.Node, format string, args ...any) *Error {
	e := &Error{File: p.file, Path: path, Rule: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line = n.Line
		e.Value = yamlnode.Written(n)
	}
	return e
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// file parses one file and returns its domain and tree.
func (p *parser) parse(data []byte) (domain string, root *node, line int, err error) {
	defer func() {
		if r := recover(); r != nil { // the YAML parser is third-party code
			err = &Error{File: p.file, Rule: fmt.Sprintf("invalid YAML: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return "", nil, 0, &Error{File: p.file, Rule: "is empty: a rules file needs a domain"}
	case err != nil:
		e := &Error{File: p.file, Rule: "invalid YAML: " + err.Error()}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			e.Rule = "invalid YAML: " + m[2]
			e.Line, _ = strconv.Atoi(m[1])
		}
		return "", nil, 0, e
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return "", nil, 0, &Error{File: p.file, Rule: "only one YAML document is allowed", Line: next.Line}
	}
	if len(doc.Content) == 0 {
		return "", nil, 0, &Error{File: p.file, Rule: "is empty: a rules file needs a domain"}
	}
	m, err := p.mapping("", doc.Content[0], "domain", "descriptors")
	if err != nil {
		return "", nil, 0, err
	}
	dn := m["domain"]
	if dn == nil {
		return "", nil, 0, &Error{File: p.file, Path: "domain", Rule: "is required: the domain Envoy's rate_limit filter names", Line: yamlnode.Resolve(doc.Content[0]).Line}
	}
	if domain, err = p.text("domain", dn); err != nil {
		return "", nil, 0, err
	}
	if domain == "" {
		return "", nil, 0, p.errorf("domain", dn, "must not be empty")
	}
	root = newNode()
	if ds := m["descriptors"]; ds != nil {
		if err := p.descriptors("descriptors", ds, root, domain, domain); err != nil {
			return "", nil, 0, err
		}
	}
	return domain, root, dn.Line, nil
}

func (p *parser) descriptors(path string, n *yaml.Node, parent *node, domain, parentKey string) error {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		return p.errorf(path, n, "must be a list of descriptors, not %s", yamlnode.KindName(n))
	}
	for i, item := range n.Content {
		if err := p.descriptor(fmt.Sprintf("%s[%d]", path, i), item, parent, domain, parentKey); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(path string, n *yaml.Node, parent *node, domain, parentKey string) error {
	m, err := p.mapping(path, n, "key", "value", "rate_limit", "shadow_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "quota_mode", "descriptors")
	if err != nil {
		return err
	}
	f, err := p.flags(path, m)
	if err != nil {
		return err
	}
	shared := f.shared
	if m["key"] == nil {
		return &Error{File: p.file, Path: path + ".key", Rule: "is required", Line: yamlnode.Resolve(n).Line}
	}
	key, err := p.text(path+".key", m["key"])
	if err != nil {
		return err
	}
	if key == "" {
		return p.errorf(path+".key", m["key"], "must not be empty")
	}
	var value string
	if v := m["value"]; v != nil {
		if value, err = p.text(path+".value", v); err != nil {
			return err
		}
	}
	full := key
	if value != "" {
		full += "_" + value
	}
	full = parentKey + "." + full
	e := entry{key, value}
	child := newNode()
	if shared && !strings.Contains(value, "*") {
		return p.errorf(path+".share_threshold", m["share_threshold"], "applies only to a descriptor whose value holds a wildcard (*): it makes every value the wildcard matches share one counter")
	}
	switch {
	case value == "":
		if parent.keyOnly[key] != nil {
			return p.errorf(path+".key", m["key"], "duplicate descriptor: %s is already defined at this level", full)
		}
		parent.keyOnly[key] = child
	case strings.Contains(value, "*"):
		for _, w := range parent.wildcard {
			if w.key == key && w.value == value {
				return p.errorf(path+".value", m["value"], "duplicate descriptor: %s is already defined at this level", full)
			}
		}
		parent.wildcard = append(parent.wildcard, wildcardNode{key: key, value: value, parts: strings.Split(value, "*"), shared: shared, n: child})
	default:
		if parent.exact[e] != nil {
			return p.errorf(path+".value", m["value"], "duplicate descriptor: %s is already defined at this level", full)
		}
		parent.exact[e] = child
	}
	parent.has++
	if rl := m["rate_limit"]; rl != nil {
		r, err := p.rateLimit(path+".rate_limit", rl, domain, full)
		if err != nil {
			return err
		}
		r.Shadow, r.DetailedMetric, r.ValueToMetric = f.shadow, f.detailed, f.valueToMetric
		child.rule = r
		p.rules = append(p.rules, r)
	}
	if ds := m["descriptors"]; ds != nil {
		return p.descriptors(path+".descriptors", ds, child, domain, full)
	}
	return nil
}

// descriptorFlags are a descriptor's boolean keys.
type descriptorFlags struct{ shared, shadow, detailed, valueToMetric bool }

// flags reads the boolean keys of the descriptor m, checks metadata and
// refuses quota_mode.
func (p *parser) flags(path string, m map[string]*yaml.Node) (descriptorFlags, error) {
	var f descriptorFlags
	if q := m["quota_mode"]; q != nil {
		return f, p.errorf(path+".quota_mode", q, "is not supported: quota_mode answers OK while some but not all quota descriptors are over their limits, and sluice decides every descriptor of a request all or nothing; use shadow_mode to observe a limit without enforcing it")
	}
	if md := m["metadata"]; md != nil && md.Kind != yaml.MappingNode {
		return f, p.errorf(path+".metadata", md, "must be a mapping, not %s", yamlnode.KindName(md))
	}
	for _, b := range []struct {
		key string
		out *bool
	}{{"share_threshold", &f.shared}, {"value_to_metric", &f.valueToMetric}, {"shadow_mode", &f.shadow}, {"detailed_metric", &f.detailed}} {
		if err := p.bool(path+"."+b.key, m[b.key], b.out); err != nil {
			return f, err
		}
	}
	return f, nil
}

// rateLimit reads the rate_limit block of the descriptor whose full key
// is full into its Rule: the names, then unlimited or the limit and the
// policy that decides it.
func (p *parser) rateLimit(path string, n *yaml.Node, domain, full string) (*Rule, error) {
	m, err := p.mapping(path, n, "unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "failure_mode", "align")
	if err != nil {
		return nil, err
	}
	r := &Rule{Domain: domain, Key: full, File: p.file, Line: yamlnode.Resolve(n).Line}
	if err := p.bool(path+".unlimited", m["unlimited"], &r.Unlimited); err != nil {
		return nil, err
	}
	if v := m["name"]; v != nil {
		if r.Name, err = p.text(path+".name", v); err != nil {
			return nil, err
		}
	}
	if v := m["replaces"]; v != nil {
		if r.Replaces, err = p.replaces(path+".replaces", v, r.Name); err != nil {
			return nil, err
		}
	}
	if r.Unlimited {
		if err := p.unset(path, m, "when unlimited is true", "unit", "requests_per_unit", "algorithm", "burst", "failure_mode", "align"); err != nil {
			return nil, err
		}
		return r, nil
	}
	if r.Unit, err = p.unit(path+".unit", m["unit"], r.Line); err != nil {
		return nil, err
	}
	if v := m["requests_per_unit"]; v != nil {
		if err := p.int(path+".requests_per_unit", v, &r.RequestsPerUnit); err != nil {
			return nil, err
		}
		if r.RequestsPerUnit < 0 || r.RequestsPerUnit > 1<<32-1 {
			return nil, p.errorf(path+".requests_per_unit", v, "must be between 0 and 4294967295")
		}
	}
	pol, err := p.policy(path, m, r)
	if err != nil {
		return nil, err
	}
	if r.RequestsPerUnit == 0 {
		// Denies everything (envoyproxy/ratelimit's way to block a value):
		// no policy, no store.
		if err := p.unset(path, m, "with requests_per_unit 0, which denies every request", "algorithm", "burst", "align"); err != nil {
			return nil, err
		}
		return r, nil
	}
	if err := pol.Validate(); err != nil {
		return nil, p.policyError(path, m, r.Line, err)
	}
	r.Policy = pol
	return r, nil
}

// replaces reads rate_limit.replaces, a list of {name: …}, into the names
// it lists; own is the rule's own name, which the list must not hold.
func (p *parser) replaces(path string, n *yaml.Node, own string) ([]string, error) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		return nil, p.errorf(path, n, "must be a list of {name: …}, not %s", yamlnode.KindName(n))
	}
	var names []string
	for i, item := range n.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		im, err := p.mapping(ipath, item, "name")
		if err != nil {
			return nil, err
		}
		var name string
		if im["name"] != nil {
			if name, err = p.text(ipath+".name", im["name"]); err != nil {
				return nil, err
			}
		}
		if name == "" {
			return nil, &Error{File: p.file, Path: ipath + ".name", Rule: "is required: the name of the rate_limit this one replaces", Line: yamlnode.Resolve(item).Line}
		}
		if name == own {
			return nil, p.errorf(ipath+".name", im["name"], "is this rate_limit's own name: a rule cannot replace itself")
		}
		names = append(names, name)
	}
	return names, nil
}

// unset returns an error for the first of keys that m sets, saying it
// must not be set for the reason why (e.g. "when unlimited is true"), or
// nil when m sets none of them.
func (p *parser) unset(path string, m map[string]*yaml.Node, why string, keys ...string) error {
	for _, k := range keys {
		if m[k] != nil {
			return p.errorf(path+"."+k, m[k], "must not be set %s", why)
		}
	}
	return nil
}

// unit reads rate_limit.unit, which n holds; a nil n is a missing unit,
// reported at line, the rate_limit block's.
func (p *parser) unit(path string, n *yaml.Node, line int) (Unit, error) {
	if n == nil {
		return 0, &Error{File: p.file, Path: path, Rule: "is required: second, minute, hour or day (or unlimited: true)", Line: line}
	}
	s, err := p.text(path, n)
	if err != nil {
		return 0, err
	}
	u, ok := units[strings.ToLower(s)]
	if !ok {
		rule := "must be one of second, minute, hour, day"
		switch strings.ToLower(s) {
		case "week", "month", "year":
			rule += ": sluice windows are at most 24h, and a month or a year has no fixed length"
		}
		return 0, p.errorf(path, n, "%s", rule)
	}
	return u, nil
}

// policy builds the sluice policy that decides r: a fixed window of r's
// requests per unit aligned to the clock, unless the rate_limit block m
// sets sluice's own keys algorithm, burst, failure_mode or align. The
// caller validates it.
func (p *parser) policy(path string, m map[string]*yaml.Node, r *Rule) (sluice.Policy, error) {
	pol := sluice.Policy{ID: PolicyID(r.Key), Algorithm: sluice.FixedWindow, Limit: r.RequestsPerUnit, Window: r.Unit.Duration()}
	var err error
	if v := m["algorithm"]; v != nil {
		if pol.Algorithm, err = p.algorithm(path+".algorithm", v); err != nil {
			return sluice.Policy{}, err
		}
	}
	if v := m["burst"]; v != nil {
		if err := p.int(path+".burst", v, &pol.Burst); err != nil {
			return sluice.Policy{}, err
		}
		if pol.Burst == 0 {
			return sluice.Policy{}, p.errorf(path+".burst", v, "must not be zero; leave it out for the default (requests_per_unit)")
		}
	}
	if v := m["failure_mode"]; v != nil {
		if r.FailureMode, err = p.failureMode(path+".failure_mode", v); err != nil {
			return sluice.Policy{}, err
		}
	}
	pol.ClockAligned = pol.Algorithm == sluice.FixedWindow
	if v := m["align"]; v != nil {
		s, err := p.text(path+".align", v)
		if err != nil {
			return sluice.Policy{}, err
		}
		switch {
		case s != "clock" && s != "first_request":
			return sluice.Policy{}, p.errorf(path+".align", v, "must be one of clock (the default: windows start on the UTC second, minute, hour or day), first_request (a window opens at its first admitted request)")
		case pol.Algorithm != sluice.FixedWindow:
			return sluice.Policy{}, p.errorf(path+".align", v, "applies only to fixed_window, the one algorithm with windows to align")
		}
		pol.ClockAligned = s == "clock"
	}
	return pol, nil
}

// algorithm reads rate_limit.algorithm: any algorithm but concurrency,
// whose leases RLS has no call to release.
func (p *parser) algorithm(path string, n *yaml.Node) (sluice.Algorithm, error) {
	s, err := p.text(path, n)
	if err != nil {
		return 0, err
	}
	a, err := config.ParseAlgorithm(s)
	if err != nil {
		return 0, p.errorf(path, n, "must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra")
	}
	if a == sluice.Concurrency {
		return 0, p.errorf(path, n, "is not supported by the Envoy service: RLS has no call to release a lease, so every lease would be held for its whole lease_ttl; limit concurrency with the check API (/v1/check and /v1/release), the proxy or the middleware")
	}
	return a, nil
}

// failureMode reads rate_limit.failure_mode: closed or open, as local
// needs a per-instance share the Envoy service does not have.
func (p *parser) failureMode(path string, n *yaml.Node) (failure.Mode, error) {
	s, err := p.text(path, n)
	if err != nil {
		return 0, err
	}
	switch s {
	case "closed":
		return failure.Closed, nil
	case "open":
		return failure.Open, nil
	}
	return 0, p.errorf(path, n, "must be one of closed, open (local needs a per-instance share, which the Envoy service does not have)")
}

// policyError turns the error of a rule's Policy.Validate into an *Error
// at the rate_limit key that set the field at fault (requests_per_unit
// for the limit, unit for the window), at line, the rate_limit block's,
// when the block does not set that key.
func (p *parser) policyError(path string, m map[string]*yaml.Node, line int, err error) *Error {
	var pe *policyerr.Error
	if !errors.As(err, &pe) {
		return &Error{File: p.file, Path: path, Rule: err.Error(), Line: line}
	}
	field := map[string]string{"limit": "requests_per_unit", "window": "unit", "max_cost": "requests_per_unit"}[pe.Field]
	if field == "" {
		field = pe.Field
	}
	e := &Error{File: p.file, Path: path + "." + field, Value: pe.Value, Rule: pe.Rule, Line: line}
	if v := m[field]; v != nil {
		e.Line, e.Value = v.Line, yamlnode.Written(v)
	}
	return e
}

// PolicyID derives a policy ID from a rule's full key: the key itself
// when it is a valid ID (1 to 64 of A-Z a-z 0-9 _ . -); otherwise the
// key with other bytes replaced by "-", cut to 55 bytes, then "-" and the
// first 8 hex digits of the key's SHA-256, so distinct keys keep distinct
// IDs.
func PolicyID(key string) string {
	clean := true
	b := []byte(key)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '-'
			clean = false
		}
	}
	if clean && len(b) <= 64 {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	if len(b) > 55 {
		b = b[:55]
	}
	return string(b) + "-" + hex.EncodeToString(sum[:4])
}

// mapping checks that n is a mapping of known, distinct keys and returns
// its values by key.
func (p *parser) mapping(path string, n *yaml.Node, known ...string) (map[string]*yaml.Node, error) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.MappingNode {
		return nil, &Error{File: p.file, Path: path, Value: yamlnode.Written(n), Rule: fmt.Sprintf("must be a mapping, not %s", yamlnode.KindName(n)), Line: n.Line}
	}
	m := make(map[string]*yaml.Node, len(n.Content)/2)
	lines := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := yamlnode.Resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
			return nil, &Error{File: p.file, Path: path, Rule: "keys must be plain names; merge keys (<<) and complex keys are not supported", Line: k.Line}
		}
		ok := false
		for _, kn := range known {
			ok = ok || kn == k.Value
		}
		if !ok {
			return nil, &Error{File: p.file, Path: yamlnode.Join(path, k.Value), Rule: "unknown key: must be one of " + strings.Join(known, ", "), Line: k.Line}
		}
		if _, dup := lines[k.Value]; dup {
			return nil, &Error{File: p.file, Path: yamlnode.Join(path, k.Value), Rule: fmt.Sprintf("is set twice (first at line %d)", lines[k.Value]), Line: k.Line}
		}
		lines[k.Value] = k.Line
		if v := yamlnode.Resolve(n.Content[i+1]); v.Kind != yaml.ScalarNode || v.Tag != "!!null" {
			m[k.Value] = v
		} // an empty value is an absent one, as envoyproxy/ratelimit reads it
	}
	return m, nil
}

// text reads a scalar as written: numbers and booleans are text too, as
// descriptor values are strings on the wire.
func (p *parser) text(path string, n *yaml.Node) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", p.errorf(path, n, "must be a string, not %s", yamlnode.KindName(n))
	}
	return n.Value, nil
}

func (p *parser) bool(path string, n *yaml.Node, out *bool) error {
	if n == nil {
		return nil
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		return p.errorf(path, n, "must be true or false")
	}
	return n.Decode(out)
}

func (p *parser) int(path string, n *yaml.Node, out *int64) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return p.errorf(path, n, "must be an integer")
	}
	if err := n.Decode(out); err != nil {
		return p.errorf(path, n, "must be an integer that fits in 64 bits")
	}
	return nil
}
