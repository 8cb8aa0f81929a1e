// Package config reads the YAML configuration of sluice serve.
//
// Parse decodes strictly: an unknown key, a wrong type or a value that
// breaks a rule is an *Error naming the field path, the value as written,
// the rule and the line, e.g.
//
//	policies[1].window: "90h": must be between 1ms and 24h (line 14)
//
// Parse reports every such error it finds, as Errors when there are
// several.
//
// Policy numbers are checked by sluice.Policy.Validate, so the library and
// the config never disagree about what a valid policy is.
package config

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/yamlnode"
)

// Config is the whole configuration of sluice serve. Parse fills in the
// defaults of absent keys (server.listen, store.type); a Config built in
// Go must set them itself (see Default). Validate checks it.
type Config struct {
	Server   Server
	Store    Store
	Policies []Policy
	Subjects Subjects
	// Proxy configures the rate-limiting reverse proxy; nil when absent.
	Proxy *Proxy
	// Envoy configures the Envoy rate-limit gRPC service; nil when absent.
	Envoy *Envoy
	// Telemetry configures the export of traces; nil when absent (none).
	Telemetry *Telemetry
	// Overrides give one subject of one policy other numbers (a tenant's
	// plan), applied by this process from the config; none when absent.
	Overrides []Override

	// pos maps field paths ("policies[1].window") to where Parse read
	// them; nil for a Config built in Go.
	pos map[string]position
}

// position is where a value was written and how, for error messages.
type position struct {
	line  int
	value string // as written: strings quoted, numbers bare; "" for collections
}

// Errors is every rule a config breaks, in the order of the file. Parse
// returns it when it finds more than one; errors.As finds each *Error.
type Errors []*Error

// Error lists the errors, one per line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
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
// Errors sorted by line for several.
func joinErrors(es []*Error) error {
	switch len(es) {
	case 0:
		return nil
	case 1:
		return es[0]
	}
	slices.SortStableFunc(es, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
	return Errors(es)
}

// Error is a config value that breaks a rule. Its message reads
// "path: value: rule (line N)", leaving out what is unknown.
type Error = yamlnode.Error

// Default returns the built-in example config that sluice serve uses
// without --config: the embedded store on 127.0.0.1:8080 and three
// policies, "demo" (fixed_window, 3 per 10s), "login" (sliding_log, 5 per
// minute) and "api" (gcra, 100 per second, burst 20).
func Default() *Config {
	return &Config{
		Server: Server{Listen: DefaultListen, DecisionTimeout: DefaultDecisionTimeout},
		Store:  Store{Type: StoreMemory},
		Policies: []Policy{
			{Policy: sluice.Policy{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second}},
			{Policy: sluice.Policy{ID: "login", Algorithm: sluice.SlidingLog, Limit: 5, Window: time.Minute}},
			{Policy: sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 20}},
		},
	}
}

// Load reads and parses the file at path. Its errors start with path. As
// with Parse, a config that decodes but breaks rules comes back with the
// error.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	c, err := Parse(f)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Line returns the line Parse read path from, e.g. "proxy"; 0 when
// unknown.
func (c *Config) Line(path string) int { return c.pos[path].line }

// Validate reports every value that breaks a rule: one *Error, or Errors
// sorted by line when there are several. Sections, list entries and the
// fields of a policy or route are checked independently; where one rule
// depends on another (a store's mode on its addrs, a token's scopes on
// its id) the first broken one is reported.
func (c *Config) Validate() error {
	var errs []*Error
	add := func(err *Error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.validateServer()...)
	add(c.validateStore())
	errs = append(errs, c.validatePolicies()...)
	errs = append(errs, c.validateSubjects()...)
	errs = append(errs, c.validateProxy()...)
	errs = append(errs, c.validateEnvoy()...)
	errs = append(errs, c.validateTelemetry()...)
	errs = append(errs, c.validateOverrides()...)
	return joinErrors(errs)
}

// errorAt builds an *Error for path. When Parse read path, the value as
// written and its line win over value; otherwise the line is that of the
// nearest enclosing value Parse read.
func (c *Config) errorAt(path, value, rule string) *Error {
	e := &Error{Path: path, Value: value, Rule: rule}
	if p, ok := c.pos[path]; ok {
		e.Line = p.line
		if p.value != "" {
			e.Value = p.value
		}
		return e
	}
	for q := parent(path); q != ""; q = parent(q) {
		if p, ok := c.pos[q]; ok {
			e.Line = p.line
			break
		}
	}
	return e
}

// withoutValue is errorAt for a path whose value names a subject (an
// override's): the error names the field and its line, never the value,
// which would reach a log line.
func (c *Config) withoutValue(path, rule string) *Error {
	e := c.errorAt(path, "", rule)
	e.Value = ""
	return e
}

// parent strips the last ".key" or "[i]" from path.
func parent(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

// sameAddr reports whether two listen addresses name the same port on
// the same host; port 0 always picks a fresh one.
func sameAddr(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa == "0" || pa != pb {
		return false
	}
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wildcard(ha) || wildcard(hb)
}

// checkHostPort returns the rule addr breaks, or "". A listen address may
// leave the host empty (every interface) and use port 0 (any free port).
func checkHostPort(addr string, listen bool) string {
	const rule = "must be host:port, such as 127.0.0.1:8080"
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return rule
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return rule + "; the port must be a number between 0 and 65535"
	}
	if !listen && (host == "" || n == 0) {
		return rule + " with a host and a port between 1 and 65535"
	}
	return ""
}

const envNameRule = "must be the name of an environment variable: A-Z a-z 0-9 _, not starting with a digit"

func validEnvName(s string) bool {
	if s == "" || ('0' <= s[0] && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
