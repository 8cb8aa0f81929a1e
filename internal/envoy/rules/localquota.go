package rules

import (
	"errors"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/yamlnode"
)

// Local quota per rule (docs/local-quota.md): a rule's rate_limit may
// carry sluice_local_quota, spelled as the main config's
// policies[].local_quota: true for the defaults, false, or a mapping of
// block_time and max_block (which turns it on). It is Rule.Policy's
// LocalQuota, judged by sluice.Policy.Validate as the main config's is;
// a rule that writes it has its own (Rule.OwnLocalQuota), which the
// config-wide envoy.local_quota does not change.

// LocalQuotaKey is the rate_limit key of a rule's local quota. Its
// "sluice_" prefix keeps an envoyproxy/ratelimit file from meaning it by
// accident.
const LocalQuotaKey = "sluice_local_quota"

// localQuota reads the sluice_local_quota of the rate_limit block m at
// path into pol and r, recording what breaks a rule: a settling rule
// takes none, as each of its requests carries an evaluation id, which
// the store decides itself (sluice.LocalQuota). Unlimited rules,
// sluice_in_flight and requests_per_unit 0 refuse the key themselves;
// the algorithm and the numbers are judged with the policy.
func (p *parser) localQuota(path string, m map[string]*yaml.Node, r *Rule, pol *sluice.Policy) {
	n := m[LocalQuotaKey]
	if n == nil {
		return
	}
	r.OwnLocalQuota = true
	path += "." + LocalQuotaKey
	q := &pol.LocalQuota
	if n = yamlnode.Resolve(n); n.Kind != yaml.MappingNode {
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			p.add(p.errorf(path, n, "must be true or false, or a mapping of block_time and max_block"))
			return
		}
		p.add(p.bool(path, n, &q.Enabled))
	} else {
		lm, err := p.mapping(path, n, "block_time", "max_block")
		if err != nil {
			p.add(err)
			return
		}
		q.Enabled = true
		if v := lm["block_time"]; v != nil {
			d, err := time.ParseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || v.Tag != "!!str" || err != nil {
				p.add(p.errorf(path+".block_time", v, "must be a duration such as 50ms"))
			} else if q.BlockTime = d; d == 0 {
				p.add(p.errorf(path+".block_time", v, "must not be zero; leave it out for the default"))
			}
		}
		if v := lm["max_block"]; v != nil {
			if err := p.int(path+".max_block", v, &q.MaxBlock); err != nil {
				p.add(err)
			} else if q.MaxBlock == 0 {
				p.add(p.errorf(path+".max_block", v, "must not be zero; leave it out for the default"))
			}
		}
	}
	if q.Enabled && r.Settles {
		e := p.errorf(path, n, "must not be set with %s: every request of a settling rule carries its request id, and the store decides each such request itself", SettleKey)
		e.Value = written(n)
		p.add(e)
	}
}

// localQuotaError turns a sluice.Policy.Validate error about the
// policy's local quota (field "local_quota" or "local_quota.<number>")
// into an *Error at the rate_limit's sluice_local_quota (m being the
// rate_limit block), at the line of the key at fault; ok is false for
// another field.
func (p *parser) localQuotaError(path string, m map[string]*yaml.Node, err error) (e *Error, ok bool) {
	var pe *policyerr.Error
	n := m[LocalQuotaKey]
	if !errors.As(err, &pe) || n == nil || !strings.HasPrefix(pe.Field, "local_quota") {
		return nil, false
	}
	e = p.errorf(path+"."+LocalQuotaKey, n, "%s", pe.Rule)
	e.Value = written(n)
	if key, ok := strings.CutPrefix(pe.Field, "local_quota."); ok {
		e.Path += "." + key
		e.Value = pe.Value
		if lm := yamlnode.Resolve(n); lm.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(lm.Content); i += 2 {
				if yamlnode.Resolve(lm.Content[i]).Value == key {
					v := yamlnode.Resolve(lm.Content[i+1])
					e.Line, e.Value = v.Line, yamlnode.Written(v)
				}
			}
		}
	}
	return e, true
}
