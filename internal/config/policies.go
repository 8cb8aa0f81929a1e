package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/yamlnode"
	"go.yaml.in/yaml/v3"
)

// Policy is one policy of the config (near_cache is sluice.Policy's
// NearCache; align: clock is its ClockAligned, align: first_request, the
// default, leaves it false; local_quota: true, or a mapping of
// block_time and max_block, is its LocalQuota).
type Policy struct {
	sluice.Policy
	// FailureMode is failure_mode: what the edges spending the policy
	// (the proxy's routes) answer when the store cannot decide; a rule's
	// property, kept beside the policy in the file's spelling. Default:
	// failure.Closed.
	FailureMode failure.Mode
}

// FailureModes returns each policy's failure_mode, by ID.
func (c *Config) FailureModes() map[string]failure.Mode {
	modes := make(map[string]failure.Mode, len(c.Policies))
	for _, p := range c.Policies {
		modes[p.ID] = p.FailureMode
	}
	return modes
}

// SluicePolicies returns the policies as sluice.New takes them.
func (c *Config) SluicePolicies() []sluice.Policy {
	ps := make([]sluice.Policy, len(c.Policies))
	for i, p := range c.Policies {
		ps[i] = p.Policy
	}
	return ps
}

func (c *Config) validatePolicies() []*Error {
	if len(c.Policies) == 0 && c.Proxy == nil && c.Envoy == nil {
		if _, written := c.pos["policies"]; written {
			return []*Error{c.errorAt("policies", "", "is empty, and the config "+needsSomething)}
		}
		return []*Error{{Rule: "the config " + needsSomething, Line: c.pos[""].line}}
	}
	var errs []*Error
	seen := make(map[string]int, len(c.Policies))
	for i, p := range c.Policies {
		for _, pe := range policyErrors(p.Policy) {
			path := fmt.Sprintf("policies[%d].%s", i, pe.Field)
			e := c.errorAt(path, pe.Value, pe.Rule)
			if _, written := c.pos[path]; c.pos != nil && !written {
				// The value is a default, not something the file says.
				e.Value = pe.Value + " (the default)"
			}
			errs = append(errs, e)
		}
		if j, dup := seen[p.ID]; dup {
			errs = append(errs, c.errorAt(fmt.Sprintf("policies[%d].id", i), strconv.Quote(p.ID), fmt.Sprintf("is already the id of policies[%d]", j)))
			continue
		}
		seen[p.ID] = i
	}
	return errs
}

// policyErrors returns every rule p breaks, as far as they stand on their
// own. sluice.Policy.Validate names the first; each field it names is
// then set aside (an optional field back to its default, an invalid id
// to a valid one, an unknown algorithm to fixed_window without the
// fields that depend on the algorithm) and p judged again. It stops at a
// limit or window, on which the other rules depend, and at a field named
// twice.
func policyErrors(p sluice.Policy) []*policyerr.Error {
	var errs []*policyerr.Error
	named := map[string]bool{}
	for range 16 {
		err := p.Validate()
		if err == nil {
			return errs
		}
		var pe *policyerr.Error
		if !errors.As(err, &pe) {
			return append(errs, &policyerr.Error{Rule: err.Error()})
		}
		if named[pe.Field] {
			return errs
		}
		named[pe.Field] = true
		errs = append(errs, pe)
		if strings.HasPrefix(pe.Field, "priorities") {
			p.Priorities = nil
			continue
		}
		switch pe.Field {
		case "id":
			p.ID = "x"
		case "revision":
			p.Revision = 0
		case "algorithm":
			if p.Window == 0 {
				return errs
			}
			p.Algorithm, p.Burst, p.MaxCost, p.LeaseTTL, p.NearCache, p.LocalQuota = sluice.FixedWindow, 0, 0, 0, false, sluice.LocalQuota{}
			named["burst"], named["max_cost"], named["lease_ttl"], named["near_cache"], named["local_quota"] = true, true, true, true, true
		case "lease_ttl":
			if p.Algorithm == sluice.Concurrency {
				return errs
			}
			p.LeaseTTL = 0
		case "window":
			if p.Algorithm != sluice.Concurrency || p.LeaseTTL == 0 {
				return errs
			}
			p.Window = 0
		case "burst":
			p.Burst = 0
		case "max_cost":
			p.MaxCost = 0
		case "near_cache":
			p.NearCache = false
		case "local_quota", "local_quota.enabled":
			p.LocalQuota = sluice.LocalQuota{}
		case "local_quota.block_time":
			p.LocalQuota.BlockTime = 0
		case "local_quota.max_block":
			p.LocalQuota.MaxBlock = 0
		case "time_zone":
			p.TimeZone = nil
		case "cleanup_grace":
			p.CleanupGrace = 0
		case "dedupe_ttl":
			p.DedupeTTL = 0
		case "dedupe_max":
			p.DedupeMax = 0
		case "max_wait":
			p.MaxWait = 0
		default:
			return errs
		}
	}
	return errs
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
