// Package yamlnode reads YAML documents node by node for the strict
// decoders of sluice's config files, which point every error at its line:
// aliases followed, a node's kind named, a scalar shown as written, and
// the error type they all report.
package yamlnode

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is a value in a file that breaks a rule. Its message reads
// "file: path: value: rule (line N)", leaving out what is unknown, e.g.
//
//	policies[1].window: "90h": must be between 1ms and 24h (line 14)
type Error struct {
	File  string // the file, when it is not the one the caller named
	Path  string // e.g. "policies[1].window"; "" for the document
	Value string // as written, e.g. `"90h"` or `0`; "" when not a scalar
	Rule  string // what the value must be
	Line  int    // 1-based; 0 when unknown (a value built in Go)
	// Column is the 1-based column where a YAML syntax error was found;
	// 0 for every other error.
	Column int
}

func (e *Error) Error() string {
	var b strings.Builder
	for _, part := range []string{e.File, e.Path, e.Value} {
		if part != "" {
			b.WriteString(part)
			b.WriteString(": ")
		}
	}
	b.WriteString(e.Rule)
	switch {
	case e.Line > 0 && e.Column > 0:
		fmt.Fprintf(&b, " (line %d, column %d)", e.Line, e.Column)
	case e.Line > 0:
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	return b.String()
}

// Resolve follows aliases to the node they name (at most 16 deep).
func Resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 16; i++ {
		n = n.Alias
	}
	return n
}

// KindName names n's kind for messages: "a mapping", "a list", "a
// scalar", "empty".
func KindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "empty"
		}
		return "a scalar"
	}
	return "an unexpected YAML node"
}

// Written is how a scalar was written, for messages: strings quoted, the
// rest bare; "" for anything but a scalar.
func Written(n *yaml.Node) string {
	n = Resolve(n)
	if n.Kind != yaml.ScalarNode {
		return ""
	}
	if n.Tag == "!!str" {
		return strconv.Quote(n.Value)
	}
	return n.Value
}

// Join returns the path of key under path.
func Join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Keys returns the keys of n in order when n is a mapping (aliases
// followed), nil otherwise: for a mapping whose keys are the writer's to
// choose, every one of them known to a strict reader.
func Keys(n *yaml.Node) []string {
	var keys []string
	if r := Resolve(n); r.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(r.Content); i += 2 {
			keys = append(keys, Resolve(r.Content[i]).Value)
		}
	}
	return keys
}

// Shares reads m, the mapping at path of priority classes to the share
// of a policy's capacity each may use, as both config files write it
// (priorities, sluice_priorities): whole percent, 50% or 50. Names and
// numbers are sluice.Policy.Validate's to judge; here only the form. It
// returns the shares of the values of that form and an Error for each
// other one.
func Shares(path string, m map[string]*yaml.Node) (map[string]int, []*Error) {
	out := make(map[string]int, len(m))
	var errs []*Error
	for class, v := range m {
		r := Resolve(v)
		share, err := strconv.Atoi(strings.TrimSuffix(r.Value, "%"))
		if r.Kind != yaml.ScalarNode || r.Value == "" || err != nil {
			errs = append(errs, &Error{Path: Join(path, class), Value: Written(v), Rule: "must be the share of the policy's capacity this class may use, in whole percent, e.g. 50%", Line: r.Line})
			continue
		}
		out[class] = share
	}
	return out, errs
}
