// Package rules reads rate-limit rules written in envoyproxy/ratelimit's
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
// metric with a descriptor value. quota_mode: true makes a descriptor's
// OVER_LIMIT stop the request only when every quota_mode descriptor of it
// is over (Rule.QuotaMode); metadata, a mapping, is sent back to Envoy as
// dynamic metadata when the descriptor passes (Rule.Metadata), as
// envoyproxy/ratelimit does with RESPONSE_DYNAMIC_METADATA.
//
// sluice adds sluice_in_flight (InFlightKey): {limit: N, lease_ttl: D}
// in place of unit and requests_per_unit makes the rule an in-flight
// limit (see Rule.InFlight), on a descriptor with a key and no value;
// sluice_settle (SettleKey) settles a cost on stream done; and
// sluice_priorities (PrioritiesKey) shares the rule's budget among
// priority classes (priority.go).
//
// Every problem of every file is reported in one pass (Errors), sorted by
// file and line: besides each value that breaks a rule, a replaces that
// names no rate_limit of the domain, and a wildcard that an earlier
// wildcard of the same key always wins over.
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
package rules

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/policyerr"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
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
	Month  Unit = 5 // a fixed 30 days, envoyproxy/ratelimit's divider
	Year   Unit = 6 // a fixed 365 days, envoyproxy/ratelimit's divider
	Week   Unit = 7 // 7 days, envoyproxy/ratelimit's divider
)

var units = map[string]Unit{"second": Second, "minute": Minute, "hour": Hour, "day": Day, "week": Week, "month": Month, "year": Year}

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
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour // envoyproxy/ratelimit's divider, not the calendar's
	case Year:
		return 365 * 24 * time.Hour // envoyproxy/ratelimit's divider, not the calendar's
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
	// QuotaMode is the descriptor's quota_mode: its OVER_LIMIT makes the
	// request OVER_LIMIT only when every quota_mode descriptor of the
	// request is over (envoyproxy/ratelimit #1045).
	QuotaMode bool
	// Metadata is the descriptor's metadata, sent back to Envoy as
	// dynamic metadata when the descriptor passes (envoy.response_metadata).
	Metadata *structpb.Struct
	// InFlight rules (rate_limit.sluice_in_flight) limit the requests in
	// flight: the request-time call acquires a lease named by the value
	// of the descriptor's last entry, the stream-done call (negative or
	// zero hits) releases it, and its LeaseTTL reclaims a lease whose
	// release never comes. RequestsPerUnit is then the limit, Unit 0 and
	// Policy a concurrency policy.
	InFlight bool
	// Settles rules (rate_limit.sluice_settle: true) spend an estimate at
	// request time and settle it with the actual cost in Envoy's
	// stream-done call; the two calls find each other by the request id
	// both carry (RequestIDKey), and the stream-done call is marked as
	// such (StreamDoneKey). package rls says how.
	Settles bool
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
	line       int // of the value, for messages
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

// wildcardCovers reports whether the wildcard pattern a matches every
// value the pattern b matches (both hold a "*"): whether a matches b
// read as a value in which each of b's "*" is a byte that only a "*" of
// a can stand for. Patterns whose lengths multiply past 1<<20 are not
// compared (false), which bounds the work a rules file can ask for.
func wildcardCovers(a, b string) bool {
	if len(a)*len(b) > 1<<20 {
		return false
	}
	// m[j]: a's prefix read so far matches b[:j].
	m := make([]bool, len(b)+1)
	m[0] = true
	for i := 0; i < len(a); i++ {
		if a[i] == '*' {
			for j := 1; j <= len(b); j++ {
				m[j] = m[j] || m[j-1]
			}
			continue
		}
		for j := len(b); j >= 1; j-- {
			m[j] = m[j-1] && b[j-1] == a[i]
		}
		m[0] = false
	}
	return m[len(b)]
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
	r, vars := c.AppendMatch(nil, domain, entries)
	if len(vars) == 0 {
		vars = nil
	}
	return r, vars
}

// AppendMatch is Match writing the entries the rule does not fix over
// vars[:0] (a caller deciding many descriptors reuses one buffer); with
// no rule, the entries returned are empty but for a descriptor whose
// last entry reaches a level without a rate_limit.
func (c *Config) AppendMatch(vars []Entry, domain string, entries []Entry) (*Rule, []Entry) {
	vars = vars[:0]
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil, vars
	}
	for i, e := range entries {
		next, variable := n.lookup(e)
		if next == nil {
			return nil, vars[:0]
		}
		if variable {
			vars = append(vars, e)
		}
		if i == len(entries)-1 {
			return next.rule, vars
		}
		if next.has == 0 {
			return nil, vars[:0] // the request is deeper than the tree
		}
		n = next
	}
	return nil, vars[:0]
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
// long as some pattern matches a file. Every problem of every file is
// reported in one pass: the error is an *Error naming the file, or
// Errors sorted by file and line when there are several.
func Load(patterns []string) (*Config, error) {
	seen := map[string]bool{}
	var files []string
	var errs []*Error
	for _, pat := range patterns {
		ms, err := filepath.Glob(pat)
		if err != nil {
			errs = append(errs, &Error{File: pat, Rule: "is not a valid glob pattern"})
			continue
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
	if len(files) == 0 && len(errs) == 0 {
		return nil, &Error{File: strings.Join(patterns, ", "), Rule: "no rules file matches"}
	}
	sort.Strings(files)
	var srcs []Source
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		srcs = append(srcs, Source{Name: f, Data: data})
	}
	c, perrs := parseSources(srcs)
	if err := joinErrors(append(errs, perrs...), files); err != nil {
		return nil, err
	}
	return c, nil
}

func readFile(name string) ([]byte, *Error) {
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
// files may not hold the same domain. Every problem is reported: the
// error is an *Error, or Errors sorted by file (in the order given) and
// line when there are several.
func Parse(files []Source) (*Config, error) {
	c, errs := parseSources(files)
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.Name
	}
	if err := joinErrors(errs, names); err != nil {
		return nil, err
	}
	return c, nil
}

// parser reads one file, carrying on past each problem it finds.
type parser struct {
	file  string
	rules []*Rule
	errs  []*Error
	named map[string]int      // rate_limit names (several rules may share one, as theirs)
	refs  []replacesReference // every replaces entry, checked at the end
}

// replacesReference is one entry of a rate_limit's replaces list.
type replacesReference struct {
	path, name string
	n          *yaml.Node
}

// Errors is every problem of a set of rules files, sorted by file and
// line. Load and Parse return it when they find more than one;
// errors.As finds each *Error.
type Errors []*Error

func (p *parser) errorf(path string, n *yaml.Node, format string, args ...any) *Error {
	e := &Error{File: p.file, Path: path, Rule: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line = n.Line
		e.Value = yamlnode.Written(n)
	}
	return e
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// parse parses one file and returns its domain, its tree (nil when the
// file is not a YAML mapping) and the domain's node; the problems found
// are in p.errs.
func (p *parser) parse(data []byte) (domain string, root *node, dn *yaml.Node) {
	defer func() {
		if r := recover(); r != nil { // the YAML parser is third-party code
			p.add(&Error{File: p.file, Rule: fmt.Sprintf("invalid YAML: %v", r)})
			root = nil
		}
	}()
	doc, err := p.document(data)
	if err != nil {
		p.add(err)
		return "", nil, nil
	}
	m, err := p.mapping("", doc, "domain", "descriptors")
	if err != nil {
		p.add(err)
		return "", nil, nil
	}
	if dn = m["domain"]; dn == nil {
		p.add(&Error{File: p.file, Path: "domain", Rule: "is required: the domain Envoy's rate_limit filter names", Line: doc.Line})
	} else if domain, err = p.text("domain", dn); err != nil {
		p.add(err)
	} else if domain == "" {
		p.add(p.errorf("domain", dn, "must not be empty"))
	}
	root = newNode()
	if ds := m["descriptors"]; ds != nil {
		p.descriptors("descriptors", ds, root, domain, domain)
	}
	p.checkReplaces()
	return domain, root, dn
}

func (p *parser) descriptors(path string, n *yaml.Node, parent *node, domain, parentKey string) {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		p.add(p.errorf(path, n, "must be a list of descriptors, not %s", yamlnode.KindName(n)))
		return
	}
	for i, item := range n.Content {
		p.descriptor(fmt.Sprintf("%s[%d]", path, i), item, parent, domain, parentKey)
	}
}

// descriptor reads one descriptor into parent's level of the tree; a
// descriptor with a problem in its key or value is still read for the
// problems of its rate_limit and descendants, on a node of its own.
func (p *parser) descriptor(path string, n *yaml.Node, parent *node, domain, parentKey string) {
	m, err := p.mapping(path, n, "key", "value", "rate_limit", "shadow_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "quota_mode", "descriptors")
	if err != nil {
		p.add(err)
		return
	}
	f := p.flags(path, m)
	key, value, ok := p.keyValue(path, n, m)
	switch key {
	case RequestIDKey, StreamDoneKey:
		p.add(p.errorf(path+".key", m["key"], "is a key sluice reads itself and removes before matching (the request id and the stream-done marker of %s): a descriptor with it would never match; see docs/envoy.md, Costs settled on stream done", SettleKey))
	case PriorityKey:
		p.add(p.errorf(path+".key", m["key"], "is a key sluice reads itself and removes before matching (the request's priority class, see %s): a descriptor with it would never match; see docs/envoy.md, Priorities", PrioritiesKey))
	}
	full := key
	if value != "" {
		full += "_" + value
	}
	full = parentKey + "." + full
	child := newNode()
	if f.shared && !strings.Contains(value, "*") {
		p.add(p.errorf(path+".share_threshold", m["share_threshold"], "applies only to a descriptor whose value holds a wildcard (*): it makes every value the wildcard matches share one counter"))
	}
	if ok {
		p.insert(path, m, parent, child, full, wildcardNode{key: key, value: value, shared: f.shared})
	}
	if rl := m["rate_limit"]; rl != nil {
		r := p.rateLimit(path+".rate_limit", rl, domain, full)
		if r.InFlight && value != "" {
			p.add(p.errorf(path+".value", m["value"], "must not be set on a descriptor with %s: the value Envoy sends for its key names the lease (e.g. the x-request-id header), so each request holds its own", InFlightKey))
		}
		r.Shadow, r.DetailedMetric, r.ValueToMetric = f.shadow, f.detailed, f.valueToMetric
		r.QuotaMode, r.Metadata = f.quota, f.metadata
		child.rule = r
		p.rules = append(p.rules, r)
	}
	if ds := m["descriptors"]; ds != nil {
		p.descriptors(path+".descriptors", ds, child, domain, full)
	}
}

// descriptorFlags are a descriptor's boolean keys.
type descriptorFlags struct {
	shared, shadow, detailed, valueToMetric, quota bool
	metadata                                       *structpb.Struct
}

// flags reads the boolean keys of the descriptor m and checks metadata
// and quota_mode, recording what breaks a rule.
func (p *parser) flags(path string, m map[string]*yaml.Node) descriptorFlags {
	var f descriptorFlags
	if md := m["metadata"]; md != nil {
		f.metadata = p.metadata(path+".metadata", md)
	}
	for _, b := range []struct {
		key string
		out *bool
	}{{"share_threshold", &f.shared}, {"value_to_metric", &f.valueToMetric}, {"shadow_mode", &f.shadow}, {"detailed_metric", &f.detailed}, {"quota_mode", &f.quota}} {
		p.add(p.bool(path+"."+b.key, m[b.key], b.out))
	}
	return f
}

// metadata reads a descriptor's metadata, a mapping sent back to Envoy
// as dynamic metadata, into a Struct; nil (and a problem recorded) when
// it is not a mapping or holds what a Struct cannot (a key that is not
// a string, a timestamp).
func (p *parser) metadata(path string, n *yaml.Node) *structpb.Struct {
	if n.Kind != yaml.MappingNode {
		p.add(p.errorf(path, n, "must be a mapping, not %s", yamlnode.KindName(n)))
		return nil
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		p.add(&Error{File: p.file, Path: path, Rule: "must be a mapping of names to values: " + err.Error(), Line: n.Line})
		return nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		p.add(&Error{File: p.file, Path: path, Rule: "cannot be sent as Envoy dynamic metadata: " + err.Error(), Line: n.Line})
		return nil
	}
	return s
}

// rateLimit reads the rate_limit block of the descriptor whose full key
// is full into its Rule: the names, then unlimited or the limit and the
// policy that decides it. A block with a problem (recorded) gives a rule
// without a policy.
func (p *parser) rateLimit(path string, n *yaml.Node, domain, full string) *Rule {
	r := &Rule{Domain: domain, Key: full, File: p.file, Line: yamlnode.Resolve(n).Line}
	m, err := p.mapping(path, n, "unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "failure_mode", "align", InFlightKey, SettleKey, PrioritiesKey)
	if err != nil {
		p.add(err)
		return r
	}
	before := len(p.errs)
	p.add(p.bool(path+".unlimited", m["unlimited"], &r.Unlimited))
	p.add(p.bool(path+"."+SettleKey, m[SettleKey], &r.Settles))
	p.names(path, m, r)
	if r.Unlimited {
		p.unset(path, m, "when unlimited is true", "unit", "requests_per_unit", "algorithm", "burst", "failure_mode", "align", InFlightKey, SettleKey)
		p.noPriorities(path, m, "when unlimited is true")
		return r
	}
	if v := m[InFlightKey]; v != nil {
		p.inFlight(path, m, v, r)
		return r
	}
	if r.Unit, err = p.unit(path+".unit", m["unit"], r.Line); err != nil {
		p.add(err)
	}
	if v := m["requests_per_unit"]; v != nil {
		if err := p.int(path+".requests_per_unit", v, &r.RequestsPerUnit); err != nil {
			p.add(err)
		} else if r.RequestsPerUnit < 0 || r.RequestsPerUnit > 1<<32-1 {
			p.add(p.errorf(path+".requests_per_unit", v, "must be between 0 and 4294967295"))
		}
	}
	pol := p.policy(path, m, r)
	if r.RequestsPerUnit == 0 {
		// Denies everything (envoyproxy/ratelimit's way to block a value):
		// no policy, no store.
		p.unset(path, m, "with requests_per_unit 0, which denies every request", "algorithm", "burst", "align", SettleKey)
		p.noPriorities(path, m, "with requests_per_unit 0, which denies every request")
		return r
	}
	pol.Priorities = p.priorities(path, m[PrioritiesKey])
	p.settles(path, m, r, &pol)
	if len(p.errs) > before {
		return r // the policy is built of values that broke a rule
	}
	if err := pol.Validate(); err != nil {
		p.add(p.policyError(path, m, r.Line, err))
		return r
	}
	r.Policy = pol
	return r
}

// replaces reads rate_limit.replaces, a list of {name: …}, into the names
// it lists; own is the rule's own name, which the list must not hold.
func (p *parser) replaces(path string, n *yaml.Node, own string) []string {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.SequenceNode {
		p.add(p.errorf(path, n, "must be a list of {name: …}, not %s", yamlnode.KindName(n)))
		return nil
	}
	var names []string
	for i, item := range n.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		im, err := p.mapping(ipath, item, "name")
		if err != nil {
			p.add(err)
			continue
		}
		var name string
		if im["name"] != nil {
			if name, err = p.text(ipath+".name", im["name"]); err != nil {
				p.add(err)
				continue
			}
		}
		switch {
		case name == "":
			p.add(&Error{File: p.file, Path: ipath + ".name", Rule: "is required: the name of the rate_limit this one replaces", Line: yamlnode.Resolve(item).Line})
		case name == own:
			p.add(p.errorf(ipath+".name", im["name"], "is this rate_limit's own name: a rule cannot replace itself"))
		default:
			p.refs = append(p.refs, replacesReference{path: ipath + ".name", name: name, n: im["name"]})
			names = append(names, name)
		}
	}
	return names
}

// unset records an error for each of keys that m sets, saying it must not
// be set for the reason why (e.g. "when unlimited is true").
func (p *parser) unset(path string, m map[string]*yaml.Node, why string, keys ...string) {
	for _, k := range keys {
		if m[k] != nil {
			p.add(p.errorf(path+"."+k, m[k], "must not be set %s", why))
		}
	}
}

// unit reads rate_limit.unit, which n holds; a nil n is a missing unit,
// reported at line, the rate_limit block's.
func (p *parser) unit(path string, n *yaml.Node, line int) (Unit, error) {
	if n == nil {
		return 0, &Error{File: p.file, Path: path, Rule: "is required: second, minute, hour, day, week, month or year (or unlimited: true)", Line: line}
	}
	s, err := p.text(path, n)
	if err != nil {
		return 0, err
	}
	u, ok := units[strings.ToLower(s)]
	if !ok {
		return 0, p.errorf(path, n, "%s", "must be one of second, minute, hour, day, week, month, year")
	}
	return u, nil
}

// policy builds the sluice policy that decides r: a fixed window of r's
// requests per unit aligned to the clock, unless the rate_limit block m
// sets sluice's own keys algorithm, burst, failure_mode or align; it
// records what breaks a rule. The caller validates it.
func (p *parser) policy(path string, m map[string]*yaml.Node, r *Rule) sluice.Policy {
	pol := sluice.Policy{ID: PolicyID(r.Key), Algorithm: sluice.FixedWindow, Limit: r.RequestsPerUnit, Window: r.Unit.Duration()}
	var err error
	if v := m["algorithm"]; v != nil {
		if pol.Algorithm, err = p.algorithm(path+".algorithm", v); err != nil {
			p.add(err)
		}
	}
	if v := m["burst"]; v != nil {
		if err := p.int(path+".burst", v, &pol.Burst); err != nil {
			p.add(err)
		} else if pol.Burst == 0 {
			p.add(p.errorf(path+".burst", v, "must not be zero; leave it out for the default (requests_per_unit)"))
		}
	}
	if v := m["failure_mode"]; v != nil {
		if r.FailureMode, err = p.failureMode(path+".failure_mode", v); err != nil {
			p.add(err)
		}
	}
	pol.ClockAligned = pol.Algorithm == sluice.FixedWindow
	if v := m["align"]; v != nil {
		s, err := p.text(path+".align", v)
		switch {
		case err != nil:
			p.add(err)
		case s != "clock" && s != "first_request":
			p.add(p.errorf(path+".align", v, "must be one of clock (the default: windows start on the UTC second, minute, hour or day), first_request (a window opens at its first admitted request)"))
		case pol.Algorithm != sluice.FixedWindow:
			p.add(p.errorf(path+".align", v, "applies only to fixed_window, the one algorithm with windows to align"))
		default:
			pol.ClockAligned = s == "clock"
		}
	}
	return pol
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
		return 0, p.errorf(path, n, "is not an algorithm of the Envoy service: an in-flight limit is %s: {limit: N, lease_ttl: D} on a descriptor whose value names the request (docs/envoy.md, In-flight limits)", InFlightKey)
	}
	return a, nil
}

// InFlightKey is the rate_limit key of sluice's in-flight limits, a
// mapping of limit (the most requests in flight per subject) and
// lease_ttl (how long a lease lives when the stream-done call never
// comes). Its "sluice_" prefix keeps an envoyproxy/ratelimit file from
// meaning it by accident.
const InFlightKey = "sluice_in_flight"

// inFlight reads the sluice_in_flight block v of the rate_limit block m
// into r: a concurrency policy whose leases the descriptor's value
// names. The descriptor must have no value (descriptor checks that), and
// m no key of a rate.
func (p *parser) inFlight(path string, m map[string]*yaml.Node, v *yaml.Node, r *Rule) {
	before := len(p.errs)
	r.InFlight = true
	p.unset(path, m, "with "+InFlightKey+", which counts requests in flight, not a rate", "unit", "requests_per_unit", "algorithm", "burst", "align", SettleKey)
	if fm := m["failure_mode"]; fm != nil {
		var err error
		if r.FailureMode, err = p.failureMode(path+".failure_mode", fm); err != nil {
			p.add(err)
		}
	}
	ipath := path + "." + InFlightKey
	im, err := p.mapping(ipath, v, "limit", "lease_ttl")
	if err != nil {
		p.add(err)
		return
	}
	pol := sluice.Policy{ID: PolicyID(r.Key), Algorithm: sluice.Concurrency}
	if l := im["limit"]; l == nil {
		p.add(&Error{File: p.file, Path: ipath + ".limit", Rule: "is required: the most requests in flight per subject", Line: v.Line})
	} else if err := p.int(ipath+".limit", l, &pol.Limit); err != nil {
		p.add(err)
	}
	if t := im["lease_ttl"]; t == nil {
		p.add(&Error{File: p.file, Path: ipath + ".lease_ttl", Rule: "is required: how long a lease lives when the stream-done call never comes (a crashed Envoy), e.g. 5m", Line: v.Line})
	} else if s, err := p.text(ipath+".lease_ttl", t); err != nil {
		p.add(err)
	} else if pol.LeaseTTL, err = time.ParseDuration(s); err != nil {
		p.add(p.errorf(ipath+".lease_ttl", t, "must be a duration such as 30s or 5m"))
	}
	pol.Priorities = p.priorities(path, m[PrioritiesKey])
	if len(p.errs) > before {
		return
	}
	if err := pol.Validate(); err != nil {
		if e, ok := p.priorityError(path, m, err); ok {
			p.add(e)
			return
		}
		e := p.policyError(ipath, im, v.Line, err)
		e.Path = strings.Replace(e.Path, "requests_per_unit", "limit", 1)
		p.add(e)
		return
	}
	r.RequestsPerUnit, r.Policy = pol.Limit, pol
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
	if e, ok := p.priorityError(path, m, err); ok {
		return e
	}
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
	// The metrics label every descriptor with it: a valid key is
	// returned without copying it (a copy longer than 32 bytes was an
	// allocation per descriptor).
	if len(key) <= 64 && validIDBytes(key) {
		return key
	}
	b := []byte(key)
	for i, c := range b {
		if !idByte(c) {
			b[i] = '-'
		}
	}
	sum := sha256.Sum256([]byte(key))
	if len(b) > 55 {
		b = b[:55]
	}
	return string(b) + "-" + hex.EncodeToString(sum[:4])
}

// validIDBytes reports whether every byte of key may be in a policy ID.
func validIDBytes(key string) bool {
	for i := 0; i < len(key); i++ {
		if !idByte(key[i]) {
			return false
		}
	}
	return true
}

// idByte reports whether c may be in a policy ID (A-Z a-z 0-9 _ . -).
func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-'
}

// mapping checks that n is a mapping and returns its values by key,
// recording each key that is unknown, repeated or not a plain name (and
// leaving it out). The error is n not being a mapping.
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
			p.add(&Error{File: p.file, Path: path, Rule: "keys must be plain names; merge keys (<<) and complex keys are not supported", Line: k.Line})
			continue
		}
		if !slices.Contains(known, k.Value) {
			p.add(&Error{File: p.file, Path: yamlnode.Join(path, k.Value), Rule: "unknown key: must be one of " + strings.Join(known, ", "), Line: k.Line})
			continue
		}
		if _, dup := lines[k.Value]; dup {
			p.add(&Error{File: p.file, Path: yamlnode.Join(path, k.Value), Rule: fmt.Sprintf("is set twice (first at line %d)", lines[k.Value]), Line: k.Line})
			continue
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

// parseSources parses every file, carrying on past each problem, and
// returns the Config and every problem found.
func parseSources(files []Source) (*Config, []*Error) {
	c := &Config{domains: map[string]*node{}}
	domainFile := map[string]string{}
	ids := map[string]*Rule{}
	var errs []*Error
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
		c.files = append(c.files, f.Name)
		p := &parser{file: f.Name}
		domain, root, dn := p.parse(f.Data)
		errs = append(errs, p.errs...)
		if root == nil {
			continue
		}
		if prev, dup := domainFile[domain]; dup {
			errs = append(errs, p.errorf("domain", dn, "is already the domain of %s: each domain lives in one file", prev))
		} else if domain != "" {
			domainFile[domain] = f.Name
			c.domains[domain] = root
		}
		for _, r := range p.rules {
			if !r.Decided() {
				continue
			}
			if other, dup := ids[r.Policy.ID]; dup {
				errs = append(errs, &Error{File: r.File, Rule: fmt.Sprintf("rule %s has policy id %q, as has rule %s in %s (line %d); rename a key", r.Key, r.Policy.ID, other.Key, other.File, other.Line), Line: r.Line})
				continue
			}
			ids[r.Policy.ID] = r
		}
		c.rules = append(c.rules, p.rules...)
	}
	c.hash = hex.EncodeToString(h.Sum(nil))
	return c, errs
}

// Error lists the errors, one per line.
func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap returns the errors for errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// joinErrors returns nil for no errors, the *Error itself for one, and
// Errors sorted by file (in the order of files; others last) and line
// for several.
func joinErrors(es []*Error, files []string) error {
	switch len(es) {
	case 0:
		return nil
	case 1:
		return es[0]
	}
	rank := func(file string) int {
		if i := slices.Index(files, file); i >= 0 {
			return i
		}
		return len(files)
	}
	slices.SortStableFunc(es, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(rank(a.File), rank(b.File)), cmp.Compare(a.Line, b.Line))
	})
	return Errors(es)
}

// add records err, an *Error from one of the parser's helpers, or any
// error (then at the file alone).
func (p *parser) add(err error) {
	if err == nil {
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{File: p.file, Rule: err.Error()}
	}
	p.errs = append(p.errs, e)
}

// document decodes data, one YAML document, and returns its top node.
func (p *parser) document(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return nil, &Error{File: p.file, Rule: "is empty: a rules file needs a domain"}
	case err != nil:
		e := &Error{File: p.file, Rule: "invalid YAML: " + err.Error()}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			e.Rule = "invalid YAML: " + m[2]
			e.Line, _ = strconv.Atoi(m[1])
		}
		return nil, e
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, &Error{File: p.file, Rule: "only one YAML document is allowed", Line: next.Line}
	}
	if len(doc.Content) == 0 {
		return nil, &Error{File: p.file, Rule: "is empty: a rules file needs a domain"}
	}
	return yamlnode.Resolve(doc.Content[0]), nil
}

// checkReplaces reports every replaces entry that names no rate_limit of
// the file's domain: it would turn the replacement off without a word.
func (p *parser) checkReplaces() {
	for _, ref := range p.refs {
		if _, ok := p.named[ref.name]; !ok {
			p.add(p.errorf(ref.path, ref.n, "names no rate_limit of this domain: replaces must name a rate_limit's name (a typo here leaves both limits applied)"))
		}
	}
}

// keyValue reads a descriptor's key and value; ok is false when either
// breaks a rule (recorded).
func (p *parser) keyValue(path string, n *yaml.Node, m map[string]*yaml.Node) (key, value string, ok bool) {
	ok = true
	if m["key"] == nil {
		p.add(&Error{File: p.file, Path: path + ".key", Rule: "is required", Line: yamlnode.Resolve(n).Line})
		ok = false
	} else if k, err := p.text(path+".key", m["key"]); err != nil {
		p.add(err)
		ok = false
	} else if key = k; key == "" {
		p.add(p.errorf(path+".key", m["key"], "must not be empty"))
		ok = false
	}
	if v := m["value"]; v != nil {
		var err error
		if value, err = p.text(path+".value", v); err != nil {
			p.add(err)
			ok = false
		}
	}
	return key, value, ok
}

// insert puts child at parent's level under w's key and value (exact,
// wildcard or key alone), unless another descriptor there already takes
// that place or, for a wildcard, takes every value it would match.
func (p *parser) insert(path string, m map[string]*yaml.Node, parent, child *node, full string, w wildcardNode) {
	key, value := w.key, w.value
	switch {
	case value == "":
		if parent.keyOnly[key] != nil {
			p.add(p.errorf(path+".key", m["key"], "duplicate descriptor: %s is already defined at this level", full))
			return
		}
		parent.keyOnly[key] = child
	case strings.Contains(value, "*"):
		for _, o := range parent.wildcard {
			switch {
			case o.key != key:
			case o.value == value:
				p.add(p.errorf(path+".value", m["value"], "duplicate descriptor: %s is already defined at this level", full))
				return
			case wildcardCovers(o.value, value):
				p.add(p.errorf(path+".value", m["value"], "can never match: the wildcard %q above it (line %d) matches every value this one does, and the first wildcard that matches wins", o.value, o.line))
				return
			}
		}
		w.parts, w.n, w.line = strings.Split(value, "*"), child, m["value"].Line
		parent.wildcard = append(parent.wildcard, w)
	default:
		e := entry{key, value}
		if parent.exact[e] != nil {
			p.add(p.errorf(path+".value", m["value"], "duplicate descriptor: %s is already defined at this level", full))
			return
		}
		parent.exact[e] = child
	}
	parent.has++
}

// names reads rate_limit.name and replaces into r, recording every
// replaces entry for checkReplaces.
func (p *parser) names(path string, m map[string]*yaml.Node, r *Rule) {
	if v := m["name"]; v != nil {
		name, err := p.text(path+".name", v)
		p.add(err)
		if r.Name = name; name != "" {
			if p.named == nil {
				p.named = map[string]int{}
			}
			p.named[name] = v.Line
		}
	}
	if v := m["replaces"]; v != nil {
		r.Replaces = p.replaces(path+".replaces", v, r.Name)
	}
}
