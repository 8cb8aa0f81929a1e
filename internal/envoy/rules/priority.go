package rules

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/yamlnode"
)

// Priorities on one budget (docs/priorities.md): a rule's rate_limit may
// carry sluice_priorities: { critical: 100%, sheddable: 50% }, the
// shares of the rule's capacity each class may use (Rule.Policy's
// Priorities, judged by sluice.Policy.Validate as the main config's
// priorities are), and a request descriptor names its class in an entry
// of key PriorityKey, which the service removes before matching (Envoy
// sets it with a request_headers action from a header only trusted
// filters set, or a generic_key per route). package rls says how a
// class the rule does not declare is decided.

// PrioritiesKey is the rate_limit key of a rule's priority classes and
// their shares. Its "sluice_" prefix keeps an envoyproxy/ratelimit file
// from meaning it by accident.
const PrioritiesKey = "sluice_priorities"

// PriorityKey is the descriptor key of the entry carrying the request's
// priority class for that descriptor.
const PriorityKey = "sluice_priority"

// priorities reads the sluice_priorities block n of the rate_limit at
// path: a mapping of class name to the share of the rule's capacity it
// may use, in percent, written 50% or 50, as the main config's
// priorities (internal/config); the names and numbers are judged
// with the rule's policy (sluice.Policy.Validate, algorithm.CheckShares).
// nil when n is nil or breaks a rule (recorded).
func (p *parser) priorities(path string, n *yaml.Node) map[string]int {
	if n == nil {
		return nil
	}
	path += "." + PrioritiesKey
	m, err := p.mapping(path, n, yamlnode.Keys(n)...) // the names are the rule's to choose
	if err != nil {
		p.add(err)
		return nil
	}
	out, errs := yamlnode.Shares(path, m)
	for _, e := range errs {
		e.File = p.file
		p.add(e)
	}
	if len(errs) > 0 {
		return nil
	}
	return out
}

// noPriorities records that the rate_limit m at path sets
// sluice_priorities where the rule has no remaining to share, for the
// reason why (e.g. "when unlimited is true").
func (p *parser) noPriorities(path string, m map[string]*yaml.Node, why string) {
	if n := m[PrioritiesKey]; n != nil {
		e := p.errorf(path+"."+PrioritiesKey, n, "must not be set %s: a rule without a remaining budget has nothing to share among classes", why)
		e.Value = written(n)
		p.add(e)
	}
}

// priorityError turns a sluice.Policy.Validate error about the policy's
// priorities (field "priorities" or "priorities.<class>") into an *Error
// at the rate_limit's sluice_priorities (m being the rate_limit block),
// at the line of the class at fault; ok is false for another field.
func (p *parser) priorityError(path string, m map[string]*yaml.Node, err error) (e *Error, ok bool) {
	var pe *policyerr.Error
	n := m[PrioritiesKey]
	if !errors.As(err, &pe) || n == nil || !strings.HasPrefix(pe.Field, "priorities") {
		return nil, false
	}
	n = yamlnode.Resolve(n)
	e = &Error{File: p.file, Path: path + "." + PrioritiesKey + strings.TrimPrefix(pe.Field, "priorities"), Value: pe.Value, Rule: pe.Rule, Line: n.Line}
	class, _ := strconv.Unquote(pe.Value) // a bad name: its value is the name quoted
	if c, ok := strings.CutPrefix(pe.Field, "priorities."); ok {
		class = c
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := yamlnode.Resolve(n.Content[i]); k.Value == class {
			e.Line = k.Line
			if pe.Field != "priorities" {
				e.Value = yamlnode.Written(n.Content[i+1]) // the share as written, as the main config quotes it
			}
		}
	}
	return e, true
}

// written renders a sluice_priorities block as written, in flow style
// (e.g. "{critical: 100%, sheddable: 50%}"), for a message.
func written(n *yaml.Node) string {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.MappingNode {
		return yamlnode.Written(n)
	}
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(n.Content); i += 2 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %s", yamlnode.Resolve(n.Content[i]).Value, yamlnode.Resolve(n.Content[i+1]).Value)
	}
	b.WriteByte('}')
	return b.String()
}
