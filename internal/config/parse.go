package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // time_zone resolves where the machine has no zoneinfo

	"go.yaml.in/yaml/v3"

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
		if idBad && (strings.HasPrefix(e.Path, "proxy.routes[") || strings.HasPrefix(e.Path, "overrides[") || strings.HasPrefix(e.Path, "envoy.rlqs.")) && strings.HasSuffix(e.Rule, "is not the id of any policy") {
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
