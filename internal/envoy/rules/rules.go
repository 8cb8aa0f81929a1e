// Package rules reads rate-limit rules written in envoyproxy/ratelimit's
// file format and matches Envoy rate-limit descriptors against them.
//
// A file holds one domain and a tree of descriptors:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit: { unit: day, requests_per_unit: 5 }
//	  - key: to_number
//	    rate_limit: { unit: day, requests_per_unit: 100 }
//
// Each descriptor has a key and optionally a value. A "*" in a value
// matches zero or more bytes, anywhere and as often as written
// ("value*", "/api/*/action", "/api/*/resource/*/action"), as
// envoyproxy/ratelimit's matcher does. share_threshold: true on a
// descriptor whose value has a "*" makes every value the wildcard matches
// spend one counter, instead of one per value. A descriptor with a
// rate_limit block is a rule: rate_limit holds unit (second, minute, hour
// or day) and requests_per_unit, or unlimited: true; optionally name and
// replaces (a list of {name: …}). shadow_mode: true reports a rule's
// verdict but never enforces it. detailed_metric and value_to_metric
// shape envoyproxy/ratelimit's statistics with descriptor values: they
// are accepted, checked and have no effect, since sluice never labels a
// metric with a descriptor value. quota_mode: true makes a descriptor's
// OVER_LIMIT stop the request only when every quota_mode descriptor of it
// is over (Rule.QuotaMode); metadata, a mapping, is sent back to Envoy as
// dynamic metadata when the descriptor passes (Rule.Metadata), as
// envoyproxy/ratelimit does with RESPONSE_DYNAMIC_METADATA.
//
// sluice adds sluice_in_flight (InFlightKey): {limit: N, lease_ttl: D}
// in place of unit and requests_per_unit makes the rule an in-flight
// limit (see Rule.InFlight), on a descriptor with a key and no value;
// sluice_settle (SettleKey) settles a cost on stream done; and
// sluice_priorities (PrioritiesKey) shares the rule's budget among
// priority classes (priority.go).
//
// Every problem of every file is reported in one pass (Errors), sorted by
// file and line: besides each value that breaks a rule, a replaces that
// names no rate_limit of the domain, and a wildcard that an earlier
// wildcard of the same key always wins over.
//
// sluice adds four optional keys to rate_limit: algorithm (default
// fixed_window), burst (token_bucket and gcra), failure_mode (closed,
// the default, or open) and align (fixed_window only: clock, the
// default, starts windows on the UTC second, minute, hour or day as
// envoyproxy/ratelimit does; first_request opens a window at its first
// admitted request, sluice's own default elsewhere).
//
// Matching follows envoyproxy/ratelimit: a request descriptor's entries are
// walked level by level, and at each level the most specific descriptor
// wins: the exact key and value, else the first wildcard value that
// matches (in file order), else the key alone. A rule applies only when the request has as many
// entries as the rule is deep.
//
// Each rule with a limit becomes a sluice.Policy whose ID is derived from
// its domain and path (see Rule.Policy), a fixed window aligned to the
// clock as theirs; the values matched by a key alone or a wildcard
// (without share_threshold) are the subject (see Match).
package rules

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/failure"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
	"github.com/sluicehq/sluice/internal/yamlnode"
)

// MaxFileSize is the largest rules file Load reads, in bytes.
const MaxFileSize = 1 << 20

// Error is a rules file that breaks a rule. Its message reads
// "file: path: value: rule (line N)", leaving out what is unknown, e.g.
//
//	ratelimit/api.yaml: descriptors[0].rate_limit.unit: "fortnight": must be one of second, minute, hour, day (line 6)
type Error = yamlnode.Error

// Unit is a rate_limit unit. Its String form is the file spelling.
type Unit uint8

// Units. Their numbers are those of envoy.service.ratelimit.v3's
// RateLimitResponse.RateLimit.Unit, so a Unit converts to it directly.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5 // a fixed 30 days, envoyproxy/ratelimit's divider
	Year   Unit = 6 // a fixed 365 days, envoyproxy/ratelimit's divider
	Week   Unit = 7 // 7 days, envoyproxy/ratelimit's divider
)

var units = map[string]Unit{"second": Second, "minute": Minute, "hour": Hour, "day": Day, "week": Week, "month": Month, "year": Year}

// String returns the file spelling, e.g. "minute".
func (u Unit) String() string {
	for name, v := range units {
		if v == u {
			return name
		}
	}
	return fmt.Sprintf("Unit(%d)", uint8(u))
}

// Duration is the length of one unit.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour // envoyproxy/ratelimit's divider, not the calendar's
	case Year:
		return 365 * 24 * time.Hour // envoyproxy/ratelimit's divider, not the calendar's
	}
	return 0
}

// Rule is one descriptor with a rate_limit block.
type Rule struct {
	// Domain is the domain of the file the rule is in.
	Domain string
	// Key is the rule's full key as envoyproxy/ratelimit names it: the
	// domain and every level's key, or key_value, joined by dots, e.g.
	// "messaging.message_type_marketing.to_number".
	Key string
	// Name is rate_limit.name, the handle replaces refers to; may be "".
	Name string
	// Replaces are the names of the rules this one replaces when both
	// apply to one request.
	Replaces []string
	// Unlimited rules are answered OK without asking the store.
	Unlimited bool
	// Shadow rules are decided and counted but always answered OK.
	Shadow bool
	// QuotaMode is the descriptor's quota_mode: its OVER_LIMIT makes the
	// request OVER_LIMIT only when every quota_mode descriptor of the
	// request is over (envoyproxy/ratelimit #1045).
	QuotaMode bool
	// Metadata is the descriptor's metadata, sent back to Envoy as
	// dynamic metadata when the descriptor passes (envoy.response_metadata).
	Metadata *structpb.Struct
	// InFlight rules (rate_limit.sluice_in_flight) limit the requests in
	// flight: the request-time call acquires a lease named by the value
	// of the descriptor's last entry, the stream-done call (negative or
	// zero hits) releases it, and its LeaseTTL reclaims a lease whose
	// release never comes. RequestsPerUnit is then the limit, Unit 0 and
	// Policy a concurrency policy.
	InFlight bool
	// Settles rules (rate_limit.sluice_settle: true) spend an estimate at
	// request time and settle it with the actual cost in Envoy's
	// stream-done call; the two calls find each other by the request id
	// both carry (RequestIDKey), and the stream-done call is marked as
	// such (StreamDoneKey). package rls says how.
	Settles bool
	// OwnLocalQuota rules write rate_limit.sluice_local_quota (true,
	// false or its numbers): Policy.LocalQuota is the rule's own, which
	// the config-wide envoy.local_quota does not change.
	OwnLocalQuota bool
	// DetailedMetric and ValueToMetric are accepted for compatibility:
	// they put descriptor values in envoyproxy/ratelimit's statistics,
	// and sluice never labels a metric with one, so they have no effect.
	DetailedMetric bool
	ValueToMetric  bool
	// RequestsPerUnit and Unit are the limit; 0 requests per unit denies
	// every request without asking the store. Zero for unlimited rules.
	RequestsPerUnit int64
	Unit            Unit
	// Policy is the sluice policy that decides the rule; its ID is zero
	// for unlimited rules and rules of 0 requests per unit, which need
	// no store.
	Policy sluice.Policy
	// FailureMode is rate_limit.failure_mode: what the service answers
	// when the store cannot decide the rule (closed, the default, or
	// open).
	FailureMode failure.Mode
	// File and Line say where the rule is written.
	File string
	Line int

	// What a request reads of the rule rather than derives from it, set
	// once when the rules load (Derive):
	//
	// Label is the rule's label in the Envoy service's metrics, its
	// policy ID as PolicyID derives it from Key (e.g. "shop.api"), for
	// unlimited rules and rules of 0 per unit too.
	Label string
	// UnitLength is the length of one Unit (Unit.Duration), e.g. 1h; 0
	// for in-flight and unlimited rules.
	UnitLength time.Duration
	// MaxCost is the most one request can ever spend of Policy (its
	// capacity, the policy's defaults applied), e.g. 5 for 5 per day; 0
	// when the store does not decide the rule.
	MaxCost int64
	// PolicyItem is the rule's member of the RateLimit-Policy field,
	// e.g. `"shop.api";q=5;w=86400`; "" when the store does not decide
	// the rule.
	PolicyItem string
}

// Derive sets the fields a request reads of r rather than derives
// (Label, UnitLength, MaxCost, PolicyItem) from the others: the loader
// calls it for every rule, and whoever builds a Rule of their own calls
// it once the rule is complete.
func (r *Rule) Derive() {
	r.Label, r.UnitLength = PolicyID(r.Key), r.Unit.Duration()
	r.MaxCost, r.PolicyItem = 0, ""
	if r.Decided() {
		r.MaxCost = evaluation.Defaults(r.Policy).MaxCost
		r.PolicyItem = string(ratelimitheader.AppendPolicyItem(nil, r.Policy))
	}
}

// Decided reports whether the store decides r (it has a Policy).
func (r *Rule) Decided() bool { return r.Policy.ID != "" }

// Config is a loaded set of rules files: one tree per domain. Build one
// with Load or Parse; it is immutable and safe for concurrent use.
type Config struct {
	domains  map[string]*node
	rules    []*Rule
	files    []string
	hash     string
	warnings []*Error
}

// Warnings returns what the files hold that loads but never acts, by file
// (in load order) and line: a rule that can never match (a wildcard the
// one above it covers, a key sluice removes before matching) and a
// replaces naming no rate_limit. envoyproxy/ratelimit loads such files, so
// sluice does too: sluice validate prints them (and refuses them with
// --strict), sluice serve logs and counts them.
func (c *Config) Warnings() []*Error { return c.warnings }

// node is one level of a domain's descriptor tree.
type node struct {
	rule     *Rule
	exact    map[entry]*node
	wildcard []wildcardNode // in file order
	keyOnly  map[string]*node
	has      int // number of children
}

type entry struct{ key, value string }

// wildcardNode is a descriptor whose value holds a "*": parts is the
// value split at every "*".
type wildcardNode struct {
	key, value string
	parts      []string
	shared     bool // share_threshold: every matching value is one counter
	n          *node
	line       int // of the value, for messages
}

// wildcardMatch reports whether value matches the pattern split into
// parts at its "*"s (at least two parts): it starts with the first, ends
// with the last, and holds the others in order between them, each "*"
// standing for zero or more bytes. Taking each middle part at its first
// place is as good as any: a later one leaves less room for the rest.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// wildcardCovers reports whether the wildcard pattern a matches every
// value the pattern b matches (both hold a "*"): whether a matches b
// read as a value in which each of b's "*" is a byte that only a "*" of
// a can stand for. Patterns whose lengths multiply past 1<<20 are not
// compared (false), which bounds the work a rules file can ask for.
func wildcardCovers(a, b string) bool {
	if len(a)*len(b) > 1<<20 {
		return false
	}
	// m[j]: a's prefix read so far matches b[:j].
	m := make([]bool, len(b)+1)
	m[0] = true
	for i := 0; i < len(a); i++ {
		if a[i] == '*' {
			for j := 1; j <= len(b); j++ {
				m[j] = m[j] || m[j-1]
			}
			continue
		}
		for j := len(b); j >= 1; j-- {
			m[j] = m[j-1] && b[j-1] == a[i]
		}
		m[0] = false
	}
	return m[len(b)]
}

func newNode() *node { return &node{exact: map[entry]*node{}, keyOnly: map[string]*node{}} }

// Domains returns the domains, sorted.
func (c *Config) Domains() []string {
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	return ds
}

// HasDomain reports whether a file holds domain.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }

// Rules returns every rule in load order (files sorted by name, then
// file order).
func (c *Config) Rules() []*Rule { return c.rules }

// Files returns the files loaded, sorted.
func (c *Config) Files() []string { return c.files }

// Hash is the SHA-256 of the files' names and contents, in hex.
func (c *Config) Hash() string { return c.hash }

// Policies returns the policies of the rules the store decides.
func (c *Config) Policies() []sluice.Policy {
	var ps []sluice.Policy
	for _, r := range c.rules {
		if r.Decided() {
			ps = append(ps, r.Policy)
		}
	}
	return ps
}

// Entry is one key/value pair of a request descriptor.
type Entry struct{ Key, Value string }

// Match returns the rule that applies to a request descriptor of domain,
// or nil, and the entries whose values the rule does not fix (matched by
// a key alone or by a wildcard without share_threshold): the part of the
// descriptor that names whose budget is spent.
func (c *Config) Match(domain string, entries []Entry) (*Rule, []Entry) {
	r, vars := c.AppendMatch(nil, domain, entries)
	if len(vars) == 0 {
		vars = nil
	}
	return r, vars
}

// AppendMatch is Match writing the entries the rule does not fix over
// vars[:0] (a caller deciding many descriptors reuses one buffer); with
// no rule, the entries returned are empty but for a descriptor whose
// last entry reaches a level without a rate_limit.
func (c *Config) AppendMatch(vars []Entry, domain string, entries []Entry) (*Rule, []Entry) {
	vars = vars[:0]
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil, vars
	}
	for i, e := range entries {
		next, variable := n.lookup(e)
		if next == nil {
			return nil, vars[:0]
		}
		if variable {
			vars = append(vars, e)
		}
		if i == len(entries)-1 {
			return next.rule, vars
		}
		if next.has == 0 {
			return nil, vars[:0] // the request is deeper than the tree
		}
		n = next
	}
	return nil, vars[:0]
}

// lookup finds the most specific child of n for e; variable reports
// whether e's value names whose budget is spent.
func (n *node) lookup(e Entry) (next *node, variable bool) {
	if next := n.exact[entry{e.Key, e.Value}]; next != nil {
		return next, false
	}
	for _, w := range n.wildcard {
		if w.key == e.Key && wildcardMatch(w.parts, e.Value) {
			return w.n, !w.shared
		}
	}
	if next := n.keyOnly[e.Key]; next != nil {
		return next, true
	}
	return nil, false
}
