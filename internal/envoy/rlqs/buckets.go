package rlqs

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice"
	conf "github.com/sluicehq/sluice/internal/config"
)

// Config is what the service splits: per domain, matchers of bucket ids
// naming policies, and its bounds. Swap replaces it as a whole.
type Config struct {
	Domains []Domain
	// Round is the period of split rounds, 100ms to 10s. Default: 1s.
	Round time.Duration
	// MaxBucketsPerDomain bounds the buckets kept of one domain, and
	// MaxBucketsPerStream those of one stream: a bucket past either gets
	// the overflow answer and keeps no state. Default: 10000 and 1000.
	MaxBucketsPerDomain, MaxBucketsPerStream int
}

// Domain is one RLQS domain's matchers, first match wins.
type Domain struct {
	Name     string
	Matchers []Matcher
}

// Matcher matches a bucket id whose key set is exactly Match's keys and
// whose values equal Match's, where "*" matches any value (each value a
// bucket of its own). Policy is the bucket's: token_bucket or gcra.
type Matcher struct {
	Match  map[string]string
	Policy sluice.Policy
}

// Defaults of Config.
const (
	defaultRound               = time.Second
	defaultMaxBucketsPerDomain = 10_000
	defaultMaxBucketsPerStream = 1000
)

// The bounds of one bucket id, in a report and in a plan naming a bucket
// (the admin API's rlqs form): 1 to MaxIDEntries entries, keys and
// values of at most MaxIDBytes bytes.
const (
	MaxIDEntries = 32
	MaxIDBytes   = 256
)

// config is a Config checked and compiled.
type config struct {
	Config
	domains map[string][]matcher
}

// matcher is a Matcher compiled.
type matcher struct {
	match  map[string]string
	policy sluice.Policy
}

// compile checks cfg and fills its defaults. The error names the field,
// value and rule.
func compile(cfg Config) (*config, error) {
	c := &config{Config: cfg, domains: make(map[string][]matcher, len(cfg.Domains))}
	if c.Round == 0 {
		c.Round = defaultRound
	}
	if c.MaxBucketsPerDomain == 0 {
		c.MaxBucketsPerDomain = defaultMaxBucketsPerDomain
	}
	if c.MaxBucketsPerStream == 0 {
		c.MaxBucketsPerStream = defaultMaxBucketsPerStream
	}
	switch {
	case c.Round < 100*time.Millisecond || c.Round > 10*time.Second:
		return nil, fmt.Errorf("rlqs: round %s: must be between 100ms and 10s", c.Round)
	case c.MaxBucketsPerDomain < 1 || c.MaxBucketsPerDomain > 1_000_000:
		return nil, fmt.Errorf("rlqs: max_buckets_per_domain %d: must be between 1 and 1000000", c.MaxBucketsPerDomain)
	case c.MaxBucketsPerStream < 1 || c.MaxBucketsPerStream > 1_000_000:
		return nil, fmt.Errorf("rlqs: max_buckets_per_stream %d: must be between 1 and 1000000", c.MaxBucketsPerStream)
	}
	for i, d := range cfg.Domains {
		if d.Name == "" {
			return nil, fmt.Errorf("rlqs: domains[%d].domain: empty: must name the domain", i)
		}
		if _, dup := c.domains[d.Name]; dup {
			return nil, fmt.Errorf("rlqs: domains[%d].domain %q: must be unique", i, d.Name)
		}
		ms := make([]matcher, len(d.Matchers))
		for j, m := range d.Matchers {
			if err := checkMatcher(m); err != nil {
				return nil, fmt.Errorf("rlqs: domains[%d].buckets[%d].%w", i, j, err)
			}
			ms[j] = matcher{match: m.Match, policy: m.Policy}
		}
		c.domains[d.Name] = ms
	}
	return c, nil
}

func checkMatcher(m Matcher) error {
	p := m.Policy
	switch {
	case len(m.Match) == 0:
		return fmt.Errorf("match: empty: must name the bucket id's keys")
	case len(m.Match) > MaxIDEntries:
		return fmt.Errorf("match: %d keys: a bucket id has at most %d", len(m.Match), MaxIDEntries)
	case p.Algorithm != sluice.TokenBucket && p.Algorithm != sluice.GCRA:
		return fmt.Errorf("policy %q: algorithm %s: must be token_bucket or gcra", p.ID, p.Algorithm)
	case p.Limit < 1 || p.Window <= 0:
		return fmt.Errorf("policy %q: limit %d per %s: must be at least 1 per a positive window", p.ID, p.Limit, p.Window)
	}
	return nil
}

// match returns the first matcher of ms that matches id, or nil.
func match(ms []matcher, id map[string]string) *matcher {
	for i := range ms {
		if conf.MatchesBucket(ms[i].match, id) {
			return &ms[i]
		}
	}
	return nil
}

// identity is the bucket id's entries, sorted by key and framed (length
// and bytes of each key and value), so two ids are one bucket exactly
// when their identities are equal.
func identity(id map[string]string) string { return string(appendIdentity(nil, id)) }

// appendIdentity appends id's identity to b: with b reused and a map
// looked up by string(b), a report's buckets are found without a string
// made for each.
func appendIdentity(b []byte, id map[string]string) []byte {
	var arr [MaxIDEntries]string // on the stack for every checked id
	keys := arr[:0]
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = strconv.AppendInt(b, int64(len(k)), 10)
		b = append(b, ':')
		b = append(b, k...)
		v := id[k]
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	return b
}

// checkReport checks the bounds of a report's buckets: each id of 1 to 32
// entries with keys and values of at most 256 bytes. How many a report
// holds is bounded by gRPC's receive limit (4 MiB), not by the caps:
// Envoy reports every bucket it caches in one message, and the buckets
// past a cap get the overflow answer. The error names the field and the
// rule, never a key or value.
func checkReport(m *rlqspb.RateLimitQuotaUsageReports) error {
	for i, u := range m.GetBucketQuotaUsages() {
		id := u.GetBucketId().GetBucket()
		if len(id) == 0 || len(id) > MaxIDEntries {
			return fmt.Errorf("bucket_quota_usages[%d].bucket_id.bucket: %d entries: must have 1 to %d", i, len(id), MaxIDEntries)
		}
		for k, v := range id {
			if len(k) > MaxIDBytes || len(v) > MaxIDBytes {
				return fmt.Errorf("bucket_quota_usages[%d].bucket_id.bucket: an entry of %d and %d bytes: keys and values must have at most %d", i, len(k), len(v), MaxIDBytes)
			}
		}
		if te := u.GetTimeElapsed(); te != nil && (te.AsDuration() < 0 || !te.IsValid()) {
			return fmt.Errorf("bucket_quota_usages[%d].time_elapsed %s: must be a valid duration of 0 or more", i, te.AsDuration())
		}
	}
	return nil
}

// policyOf is m's policy with the plan of (its id, subject) applied, if
// ovr has one.
func policyOf(m *matcher, subject string, ovr map[planKey]sluice.Override) sluice.Policy {
	p := m.policy
	o, ok := ovr[planKey{p.ID, subject}]
	if !ok || o.Limit <= 0 {
		return p
	}
	p.Limit, p.Burst = o.Limit, o.Burst
	if o.Window > 0 {
		p.Window = o.Window
	}
	return p
}

// planKey is what a tenant plan names: a policy and a subject.
type planKey struct{ policy, subject string }
