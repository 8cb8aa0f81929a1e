package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/yamlnode"
	"go.yaml.in/yaml/v3"
)

// rateLimit reads the rate_limit block of the descriptor whose full key
// is full into its Rule: the names, then unlimited or the limit and the
// policy that decides it. A block with a problem (recorded) gives a rule
// without a policy.
func (p *parser) rateLimit(path string, n *yaml.Node, domain, full string) *Rule {
	r := &Rule{Domain: domain, Key: full, File: p.file, Line: yamlnode.Resolve(n).Line}
	m, err := p.mapping(path, n, "unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "failure_mode", "align", InFlightKey, SettleKey, PrioritiesKey, LocalQuotaKey)
	if err != nil {
		p.add(err)
		return r
	}
	before := len(p.errs)
	p.add(p.bool(path+".unlimited", m["unlimited"], &r.Unlimited))
	p.add(p.bool(path+"."+SettleKey, m[SettleKey], &r.Settles))
	p.names(path, m, r)
	if r.Unlimited {
		p.unset(path, m, "when unlimited is true", "unit", "requests_per_unit", "algorithm", "burst", "failure_mode", "align", InFlightKey, SettleKey, LocalQuotaKey)
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
		p.unset(path, m, "with requests_per_unit 0, which denies every request", "algorithm", "burst", "align", SettleKey, LocalQuotaKey)
		p.noPriorities(path, m, "with requests_per_unit 0, which denies every request")
		return r
	}
	pol.Priorities = p.priorities(path, m[PrioritiesKey])
	p.settles(path, m, r, &pol)
	p.localQuota(path, m, r, &pol)
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
	p.unset(path, m, "with "+InFlightKey+", which counts requests in flight, not a rate", "unit", "requests_per_unit", "algorithm", "burst", "align", SettleKey, LocalQuotaKey)
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
	if e, ok := p.localQuotaError(path, m, err); ok {
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
