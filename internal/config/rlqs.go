package config

import (
	"cmp"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/yamlnode"
	"go.yaml.in/yaml/v3"
)

// The defaults of envoy.rlqs, which Parse fills in for absent keys.
const (
	DefaultRLQSRound               = time.Second
	DefaultRLQSMaxBucketsPerDomain = 10000
	DefaultRLQSMaxBucketsPerStream = 1000
)

// RLQS configures Envoy's rate-limit quota service (envoy.rlqs): per
// domain, the matchers that give each bucket id its policy, which the
// service splits among the Envoys reporting the bucket.
type RLQS struct {
	// Round is how often each instance splits every bucket of a domain
	// anew, 100ms to 10s. Default: 1s.
	Round time.Duration
	// MaxBucketsPerDomain and MaxBucketsPerStream cap the buckets the
	// service keeps state for, 1 to 1000000; past either a bucket gets
	// the overflow answer (docs/rlqs.md). Default: 10000 and 1000.
	MaxBucketsPerDomain, MaxBucketsPerStream int64
	Domains                                  []RLQSDomain
}

// RLQSDomain is the bucket matchers of one domain, the domain the
// rate_limit_quota filter of Envoy names; the first matcher that matches
// a bucket id wins.
type RLQSDomain struct {
	Domain  string
	Buckets []RLQSBucket
}

// RLQSBucket is a bucket matcher: a bucket id matches when it has
// exactly Match's keys and each value equals Match's, or Match's is "*"
// (any value, each its own bucket). Policy is the id of a token_bucket or
// gcra policy of the config.
type RLQSBucket struct {
	Match  map[string]string
	Policy string
}

// RLQSBucketID names one bucket of Envoy's rate-limit quota service, an
// override's rlqs: its domain and its bucket id, every value that of the
// bucket (never "*").
type RLQSBucketID struct {
	Domain string
	Bucket map[string]string
}

// Match returns the first matcher of domain that matches the bucket id
// id; ok is false when none does (or r has no such domain).
func (r *RLQS) Match(domain string, id map[string]string) (b RLQSBucket, ok bool) {
	for _, d := range r.Domains {
		if d.Domain != domain {
			continue
		}
		for _, b := range d.Buckets {
			if MatchesBucket(b.Match, id) {
				return b, true
			}
		}
	}
	return RLQSBucket{}, false
}

// MatchesBucket reports whether the matcher m takes the bucket id id:
// the same keys, each value equal to m's or m's "*". It is the one
// matching rule of RLQS: the service matches reports with it. With id a
// matcher itself, it reports whether m shadows id.
func MatchesBucket(m, id map[string]string) bool {
	if len(m) != len(id) {
		return false
	}
	for k, v := range id {
		w, ok := m[k]
		if !ok || w != "*" && w != v {
			return false
		}
	}
	return true
}

// sameKeys reports whether a and b have the same keys.
func sameKeys(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// Warnings returns what the config holds that loads but never acts, or
// acts other than meant: an RLQS matcher an earlier one of its domain
// shadows (the same key set, each earlier value equal or "*"), which no
// bucket id can reach; and one whose policy is too small for the floor
// share of an idle or new Envoy in a fleet of 16 (smallFloor). sluice
// validate prints them; --strict refuses them.
func (c *Config) Warnings() []*Error {
	if c.Envoy == nil || c.Envoy.RLQS == nil {
		return nil
	}
	var ws []*Error
	for i, d := range c.Envoy.RLQS.Domains {
		for j, b := range d.Buckets {
			if w := c.smallFloor(fmt.Sprintf("envoy.rlqs.domains[%d].buckets[%d].policy", i, j), b.Policy); w != nil {
				ws = append(ws, w)
			}
			for k, earlier := range d.Buckets[:j] {
				if len(b.Match) > 0 && MatchesBucket(earlier.Match, b.Match) {
					path := fmt.Sprintf("envoy.rlqs.domains[%d].buckets[%d].match", i, j)
					ws = append(ws, c.errorAt(path, "", fmt.Sprintf("can never match: buckets[%d] above it (line %d) matches every bucket id this one does, and the first match wins",
						k, c.Line(fmt.Sprintf("envoy.rlqs.domains[%d].buckets[%d].match", i, k)))))
					break
				}
			}
		}
	}
	return ws
}

// floorFleet is the fleet smallFloor warns for: 16 Envoys reporting one
// bucket, whose floor share is 1/(8·(16+1)) = 1/136 of the policy (the
// split's floorShare, internal/envoy/rlqs).
const floorFleet = 16

// floorRule is why smallFloor warns.
const floorRule = "among 16 Envoys an idle or new one's floor share (1/136 of the policy) is too small for a token bucket, so it gets DENY_ALL until its demand earns it a share"

// smallFloor is the warning for a matcher (at path) of policy id when the
// floor share of an idle or new stream among floorFleet is less than one
// token of burst (burst < 136) or less than the least rate sluice sends,
// one token in 1000 s (rate < 0.136 a second): sluice answers such a
// share with DENY_ALL (docs/rlqs.md, "Small policies"). nil otherwise,
// and for a policy the errors already refuse.
func (c *Config) smallFloor(path, id string) *Error {
	p := c.policy(id)
	if p == nil || p.Algorithm != sluice.TokenBucket && p.Algorithm != sluice.GCRA || p.Limit < 1 || p.Window <= 0 {
		return nil
	}
	d := int64(8 * (floorFleet + 1))
	burst, how := p.Burst, ""
	if burst == 0 {
		burst, how = p.Limit, " (the default: its limit)"
	}
	// The floor's rate in milli-tokens a second, ⌊⌊limit·10¹²/window⌋/d⌋,
	// is at least 1 when limit·10¹² ≥ d·window (in 128 bits).
	hi, lo := bits.Mul64(uint64(p.Limit), 1e12)
	shortRate := hi == 0 && lo < uint64(d)*uint64(p.Window)
	shortBurst := burst < d
	var has, set []string
	if shortBurst {
		has = append(has, fmt.Sprintf("has burst %d%s", burst, how))
		set = append(set, fmt.Sprintf("burst to at least %d", d))
	}
	if shortRate {
		rate := strconv.FormatFloat(float64(p.Limit)/p.Window.Seconds(), 'g', 3, 64)
		has = append(has, fmt.Sprintf("refills %s tokens a second (%d per %s)", rate, p.Limit, p.Window))
		set = append(set, fmt.Sprintf("a rate of at least %s a second", strconv.FormatFloat(float64(d)/1000, 'f', -1, 64)))
	}
	if len(has) == 0 {
		return nil
	}
	return c.errorAt(path, strconv.Quote(id), fmt.Sprintf("%s: %s; set %s", strings.Join(has, " and "), floorRule, strings.Join(set, " and ")))
}

// validateRLQS checks envoy.rlqs: the ranges, each domain named once,
// and each matcher (see matcherErrors), every problem at once.
func (c *Config) validateRLQS(r *RLQS) []*Error {
	var errs []*Error
	if r.Round < 100*time.Millisecond || r.Round > 10*time.Second {
		errs = append(errs, c.errorAt("envoy.rlqs.round", r.Round.String(), "must be between 100ms and 10s"))
	}
	for _, b := range []struct {
		field string
		v     int64
	}{{"max_buckets_per_domain", r.MaxBucketsPerDomain}, {"max_buckets_per_stream", r.MaxBucketsPerStream}} {
		if b.v < 1 || b.v > 1_000_000 {
			errs = append(errs, c.errorAt("envoy.rlqs."+b.field, strconv.FormatInt(b.v, 10), "must be between 1 and 1000000"))
		}
	}
	if len(r.Domains) == 0 {
		errs = append(errs, c.errorAt("envoy.rlqs.domains", "", "at least one domain is required"))
	}
	seen := map[string]int{}
	for i, d := range r.Domains {
		path := fmt.Sprintf("envoy.rlqs.domains[%d]", i)
		if j, dup := seen[d.Domain]; dup {
			errs = append(errs, c.errorAt(path+".domain", strconv.Quote(d.Domain), fmt.Sprintf("is already the domain of envoy.rlqs.domains[%d]", j)))
		} else if d.Domain == "" {
			errs = append(errs, c.errorAt(path+".domain", `""`, "must not be empty: the domain the rate_limit_quota filter names"))
		} else {
			seen[d.Domain] = i
		}
		if len(d.Buckets) == 0 {
			errs = append(errs, c.errorAt(path+".buckets", "", "at least one bucket matcher is required"))
		}
		for j, b := range d.Buckets {
			errs = append(errs, c.matcherErrors(fmt.Sprintf("%s.buckets[%d]", path, j), b)...)
		}
	}
	return errs
}

// matcherErrors checks one bucket matcher: keys and values not empty, and
// a policy of the config that Envoy's token bucket can enforce
// (token_bucket or gcra, a burst of at least its rate per second).
func (c *Config) matcherErrors(path string, b RLQSBucket) []*Error {
	var errs []*Error
	if len(b.Match) == 0 {
		errs = append(errs, c.errorAt(path+".match", "", `must name at least one key of the bucket id, such as {tenant: "*"}`))
	}
	for _, k := range slices.Sorted(maps.Keys(b.Match)) {
		switch {
		case k == "":
			errs = append(errs, c.errorAt(path+".match", `""`, "a key of the bucket id must not be empty"))
		case b.Match[k] == "":
			errs = append(errs, c.errorAt(path+".match."+k, `""`, `must not be empty: the value to equal, or "*" for any value (each its own bucket)`))
		}
	}
	p := c.policy(b.Policy)
	switch {
	case p == nil:
		errs = append(errs, c.errorAt(path+".policy", strconv.Quote(b.Policy), "is not the id of any policy"))
	case p.Algorithm != sluice.TokenBucket && p.Algorithm != sluice.GCRA:
		errs = append(errs, c.errorAt(path+".policy", strconv.Quote(b.Policy), fmt.Sprintf("is a %s policy: Envoy enforces a token bucket, so an RLQS bucket's policy must be token_bucket or gcra (a rate and a burst)", p.Algorithm)))
	default:
		burst, how := p.Burst, ""
		if burst == 0 {
			burst, how = p.Limit, " (the default: its limit)"
		}
		if need, rate, short := ShortBurst(p.Limit, burst, p.Window); short {
			errs = append(errs, c.errorAt(path+".policy", strconv.Quote(b.Policy), fmt.Sprintf("has burst %d%s, below the %s tokens per second it refills (%d per %s): %s; set burst to at least %d",
				burst, how, rate, p.Limit, p.Window, BurstRule, need)))
		}
	}
	return errs
}

// BurstRule is why an RLQS bucket's burst must cover its rate per
// second: Envoy refills its token bucket continuously, capped at
// max_tokens, so a share shallower than a second of its rate loses the
// refill of every pause longer than max_tokens/rate. The admin API
// refuses a plan with it as validate does.
const BurstRule = "a token bucket holding less than a second of its rate loses its refill whenever requests pause"

// ShortBurst reports whether burst is below the tokens that limit per
// window refills in one second, and then the least burst that is not
// and that rate, as written for a message: the rule of an RLQS bucket's
// policy and plan, in the config file and the admin API alike. Numbers a policy's own rules
// refuse (a limit past 10^9, no window) are left to those rules.
func ShortBurst(limit, burst int64, window time.Duration) (need int64, rate string, short bool) {
	if limit < 1 || limit > 1_000_000_000 || burst < 1 || window <= 0 {
		return 0, "", false
	}
	// burst·window ≥ limit·1s, in 128 bits: burst·window may pass 2^63.
	hi, lo := bits.Mul64(uint64(burst), uint64(window))
	perSecond := uint64(limit) * uint64(time.Second) // ≤ 10^18
	if hi > 0 || lo >= perSecond {
		return 0, "", false
	}
	need = int64((perSecond + uint64(window) - 1) / uint64(window))
	rate = strconv.FormatFloat(float64(limit)/window.Seconds(), 'f', -1, 64)
	return need, rate, true
}

// policy returns the config's policy of id, nil when none has it.
func (c *Config) policy(id string) *Policy {
	for i := range c.Policies {
		if c.Policies[i].ID == id {
			return &c.Policies[i]
		}
	}
	return nil
}

// rlqsOverrideErrors checks an override naming an RLQS bucket: a domain
// of envoy.rlqs, a bucket id of real values that a matcher of it matches,
// its policy (if named) that matcher's, each bucket once, and numbers the
// policy takes whose burst covers their rate per second. Bucket values
// name tenants: no error shows them.
func (c *Config) rlqsOverrideErrors(i int, o Override, seen map[string]int) []*Error {
	path, id := fmt.Sprintf("overrides[%d]", i), o.RLQS
	switch {
	case o.Subject != "" || o.Envoy != nil || o.Proxy != nil:
		return []*Error{c.errorAt(path, "", "names its subject twice: set one of subject, envoy, proxy and rlqs")}
	case c.Envoy == nil || c.Envoy.RLQS == nil:
		return []*Error{c.errorAt(path+".rlqs", "", "names a bucket of Envoy's quota service, and there is no envoy.rlqs section")}
	case !slices.ContainsFunc(c.Envoy.RLQS.Domains, func(d RLQSDomain) bool { return d.Domain == id.Domain }):
		return []*Error{c.errorAt(path+".rlqs.domain", strconv.Quote(id.Domain), "is not a domain of envoy.rlqs")}
	case len(id.Bucket) == 0:
		return []*Error{c.withoutValue(path+".rlqs.bucket", "must hold the bucket id's entries, such as {tenant: acme}")}
	case len(o.Note) > 200:
		return []*Error{c.errorAt(path+".note", strconv.Quote(o.Note), "must be at most 200 bytes")}
	case o.Limit < 1:
		return []*Error{c.errorAt(path+".limit", strconv.FormatInt(o.Limit, 10), "must be at least 1")}
	}
	var errs []*Error
	for _, k := range slices.Sorted(maps.Keys(id.Bucket)) {
		switch id.Bucket[k] {
		case "*":
			errs = append(errs, c.errorAt(path+".rlqs.bucket."+k, `"*"`, "names no one bucket: a plan is for one bucket id, each value the one that bucket has"))
		case "":
			errs = append(errs, c.withoutValue(path+".rlqs.bucket."+k, "must not be empty: the value the bucket id has"))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	b, ok := c.Envoy.RLQS.Match(id.Domain, id.Bucket)
	if !ok {
		return []*Error{c.withoutValue(path+".rlqs.bucket", c.noMatcherRule(id))}
	}
	if o.Policy != "" && o.Policy != b.Policy {
		return []*Error{c.errorAt(path+".policy", strconv.Quote(o.Policy), fmt.Sprintf("the bucket's matcher has policy %q; leave policy out or name that one", b.Policy))}
	}
	key := id.Domain + "\x00" + sortedBucket(id.Bucket)
	if j, dup := seen[key]; dup {
		return []*Error{c.withoutValue(path+".rlqs.bucket", fmt.Sprintf("is already overridden by overrides[%d]", j))}
	}
	seen[key] = i
	base := c.policy(b.Policy)
	if base == nil {
		return nil // the matcher's own error names it
	}
	if err := c.overrideNumbers(path, base.Policy, o); err != nil {
		return []*Error{err}
	}
	window := cmp.Or(o.Window, base.Window)
	burst := cmp.Or(o.Burst, o.Limit)
	if need, rate, short := ShortBurst(o.Limit, burst, window); short {
		return []*Error{c.errorAt(path+".burst", strconv.FormatInt(burst, 10), fmt.Sprintf("is below the %s tokens per second the plan refills (%d per %s): %s; set burst to at least %d", rate, o.Limit, window, BurstRule, need))}
	}
	return nil
}

// noMatcherRule says why no matcher of id's domain matches id: none has
// its key set, or none with it has its values.
func (c *Config) noMatcherRule(id *RLQSBucketID) string {
	for _, d := range c.Envoy.RLQS.Domains {
		if d.Domain == id.Domain && slices.ContainsFunc(d.Buckets, func(b RLQSBucket) bool { return sameKeys(b.Match, id.Bucket) }) {
			return fmt.Sprintf(`no matcher of domain %q matches it (each value must equal the matcher's, or the matcher's be "*"), so the plan would never apply`, id.Domain)
		}
	}
	return fmt.Sprintf("has the keys %v: no matcher of domain %q has that key set, so the plan would never apply", slices.Sorted(maps.Keys(id.Bucket)), id.Domain)
}

// sortedBucket is a bucket id in one form whatever its order: its
// entries sorted by key, each "key=value" quoted.
func sortedBucket(b map[string]string) string {
	var s strings.Builder
	for _, k := range slices.Sorted(maps.Keys(b)) {
		fmt.Fprintf(&s, "%q=%q,", k, b[k])
	}
	return s.String()
}

// rlqs decodes envoy.rlqs; never nil, so that a section that did not
// decode still stands for the quota service (envoy.configs then being
// optional).
func (d *decoder) rlqs(path string, n *yaml.Node) *RLQS {
	r := &RLQS{Round: DefaultRLQSRound, MaxBucketsPerDomain: DefaultRLQSMaxBucketsPerDomain, MaxBucketsPerStream: DefaultRLQSMaxBucketsPerStream}
	m, ok := d.mapping(path, n, "round", "max_buckets_per_domain", "max_buckets_per_stream", "domains")
	if !ok {
		return r
	}
	d.required(path, n, m, "domains")
	d.duration(path+".round", m["round"], &r.Round)
	d.int(path+".max_buckets_per_domain", m["max_buckets_per_domain"], &r.MaxBucketsPerDomain)
	d.int(path+".max_buckets_per_stream", m["max_buckets_per_stream"], &r.MaxBucketsPerStream)
	if m["domains"] == nil {
		return r
	}
	items, ok := d.sequence(path+".domains", m["domains"])
	if !ok {
		return r
	}
	r.Domains = make([]RLQSDomain, len(items))
	for i, item := range items {
		dpath := fmt.Sprintf("%s.domains[%d]", path, i)
		dm, ok := d.mapping(dpath, item, "domain", "buckets")
		if !ok {
			continue
		}
		d.required(dpath, item, dm, "domain", "buckets")
		d.str(dpath+".domain", dm["domain"], &r.Domains[i].Domain)
		r.Domains[i].Buckets = d.rlqsBuckets(dpath+".buckets", dm["buckets"])
	}
	return r
}

// rlqsBuckets decodes a domain's buckets: [{match, policy}, …].
func (d *decoder) rlqsBuckets(path string, n *yaml.Node) []RLQSBucket {
	if n == nil {
		return nil
	}
	items, ok := d.sequence(path, n)
	if !ok {
		return nil
	}
	bs := make([]RLQSBucket, len(items))
	for i, item := range items {
		bpath := fmt.Sprintf("%s[%d]", path, i)
		m, ok := d.mapping(bpath, item, "match", "policy")
		if !ok {
			continue
		}
		d.required(bpath, item, m, "match", "policy")
		if m["match"] != nil {
			bs[i].Match = d.stringMap(bpath+".match", m["match"], false)
		}
		d.str(bpath+".policy", m["policy"], &bs[i].Policy)
	}
	return bs
}

// stringMap decodes a mapping of string keys the writer chooses to
// string values (a bucket matcher, a bucket id). A key that is not a
// string, or is set twice, is recorded and left out. With raw (a bucket
// id's values name a tenant) no error shows a value.
func (d *decoder) stringMap(path string, n *yaml.Node, raw bool) map[string]string {
	n = yamlnode.Resolve(n)
	if n.Kind != yaml.MappingNode {
		d.fail(&Error{Path: path, Value: yamlnode.Written(n), Rule: fmt.Sprintf("must be a mapping of the bucket id's keys to values, not %s", yamlnode.KindName(n)), Line: n.Line})
		return nil
	}
	out := make(map[string]string, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := yamlnode.Resolve(n.Content[i])
		kpath := yamlnode.Join(path, k.Value)
		switch _, dup := out[k.Value]; {
		case k.Kind != yaml.ScalarNode || k.Tag != "!!str":
			d.fail(&Error{Path: path, Value: yamlnode.Written(k), Rule: "keys must be plain strings; merge keys (<<) and complex keys are not supported", Line: k.Line})
			continue
		case dup:
			d.errs = append(d.errs, &Error{Path: kpath, Rule: fmt.Sprintf("is set twice (first at line %d)", d.pos[kpath].line), Line: k.Line})
			continue
		}
		v := yamlnode.Resolve(n.Content[i+1])
		if d.pos[kpath] = (position{line: k.Line, value: yamlnode.Written(v)}); raw {
			d.pos[kpath] = position{line: k.Line}
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
			e := scalar(kpath, v, "a string", "!!str")
			if v.Kind == yaml.ScalarNode && v.Tag != "!!null" {
				e.Rule += "; quote it"
			}
			if raw {
				e.Value = ""
			}
			d.fail(e)
			continue
		}
		out[k.Value] = v.Value
	}
	return out
}

// rlqsBucketID decodes an override's rlqs: {domain, bucket: {key: value,
// …}}; never nil, so that one that did not decode still marks the
// override as naming an RLQS bucket.
func (d *decoder) rlqsBucketID(path string, n *yaml.Node) *RLQSBucketID {
	id := &RLQSBucketID{}
	m, ok := d.mapping(path, n, "domain", "bucket")
	if !ok {
		return id
	}
	d.required(path, n, m, "domain", "bucket")
	d.str(path+".domain", m["domain"], &id.Domain)
	if m["bucket"] != nil {
		id.Bucket = d.stringMap(path+".bucket", m["bucket"], true)
	}
	return id
}
