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

	"github.com/sluicehq/sluice/internal/yamlnode"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

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
	warns []*Error            // what loads but never acts: a dead rule, a replaces naming none
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
		p.warns = append(p.warns, p.errorf(path+".key", m["key"], "is a key sluice reads itself and removes before matching (the request id and the stream-done marker of %s): a descriptor with it would never match; see docs/envoy.md, Costs settled on stream done", SettleKey))
	case PriorityKey:
		p.warns = append(p.warns, p.errorf(path+".key", m["key"], "is a key sluice reads itself and removes before matching (the request's priority class, see %s): a descriptor with it would never match; see docs/envoy.md, Priorities", PrioritiesKey))
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
		r.Derive()
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
		c.warnings = append(c.warnings, p.warns...)
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
			p.warns = append(p.warns, p.errorf(ref.path, ref.n, "names no rate_limit of this domain: it replaces nothing (a typo here leaves both limits applied)"))
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
				p.warns = append(p.warns, p.errorf(path+".value", m["value"], "can never match: the wildcard %q above it (line %d) matches every value this one does, and the first wildcard that matches wins", o.value, o.line))
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
