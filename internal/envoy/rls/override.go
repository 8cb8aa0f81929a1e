package rls

import (
	"fmt"
	"strings"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/envoy/rules"
)

// OverrideRule is the rule label of descriptors decided by a limit
// override (RateLimitDescriptor.limit): its numbers come from the client,
// so they never become label values.
const OverrideRule = "(override)"

// maxOverrides bounds the override limiters a State keeps; numbers past
// it get a Limiter for the one request.
const maxOverrides = 1024

// overrideLimit is a set of override numbers with its rule and Limiter.
type overrideLimit struct {
	rule *rules.Rule
	core *edge.Core // nil when rule is decided without the store
}

// override returns the rule and Limiter that decide a descriptor whose
// limit override is o, as envoyproxy/ratelimit applies one: o's numbers
// replace the rule that matches, and apply when none does, in a known
// domain; the override is never shadow, unlimited, named or replaced.
// Its policy, a fixed window aligned to the clock, has an ID derived
// from the numbers (e.g. "limit-override.100-per-60s"), so each set of
// numbers counts on a counter of its own and one counter never holds two
// limits. The error says why o cannot be applied. match never asks for
// a descriptor of an in-flight rule (rules.Rule.InFlight): its limit is
// ignored there, since o's count per unit would replace its leases, so
// that every stream, whose request id is an entry, got a budget of its
// own.
func (st *State) override(o *commonpb.RateLimitDescriptor_RateLimitOverride) (*overrideLimit, error) {
	unit := rules.Unit(o.GetUnit())
	switch o.GetUnit() {
	case typepb.RateLimitUnit_SECOND, typepb.RateLimitUnit_MINUTE, typepb.RateLimitUnit_HOUR, typepb.RateLimitUnit_DAY,
		typepb.RateLimitUnit_MONTH, typepb.RateLimitUnit_YEAR: // their fixed dividers, as a rules file's
	default:
		return nil, fmt.Errorf("limit.unit %s: must be SECOND, MINUTE, HOUR, DAY, MONTH or YEAR", o.GetUnit())
	}
	mult := int64(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = int64(m.GetValue())
	}
	window := time.Duration(mult) * unit.Duration()
	if mult < 1 || window > time.Duration(algorithm.MaxWindow)*time.Microsecond {
		return nil, fmt.Errorf("limit.unit_multiplier %d: the window, %d × %s, must be between one unit and 365 days", mult, mult, unit)
	}
	rpu := int64(o.GetRequestsPerUnit())
	if rpu > algorithm.MaxLimit {
		return nil, fmt.Errorf("limit.requests_per_unit %d: must be at most %d", rpu, algorithm.MaxLimit)
	}
	key := fmt.Sprintf("limit-override.%d-per-%ds", rpu, int64(window/time.Second))
	st.mu.Lock()
	defer st.mu.Unlock()
	if ol := st.overrides[key]; ol != nil {
		return ol, nil
	}
	r := &rules.Rule{Key: key, RequestsPerUnit: rpu, Unit: unit}
	ol := &overrideLimit{rule: r}
	if rpu > 0 { // 0 denies everything without the store, as a rule of 0 does
		r.Policy = sluice.Policy{ID: key, Algorithm: sluice.FixedWindow, Limit: rpu, Window: window, ClockAligned: true}
	}
	r.Derive()
	r.Label = OverrideRule // its numbers come from the client
	if rpu > 0 {
		lim, err := sluice.New(decideOnly{st.Store}, []sluice.Policy{r.Policy}, sluice.Options{})
		if err != nil {
			return nil, fmt.Errorf("limit: %w", err)
		}
		ol.core = st.core.With(lim)
	}
	if st.overrides == nil {
		st.overrides = map[string]*overrideLimit{}
	}
	if len(st.overrides) < maxOverrides {
		st.overrides[key] = ol
	}
	return ol, nil
}

// decideOnly is a Store seen only as one: a limit override's Limiter
// decides on it, but no tenant plan can name its policy, so it must not
// read the store's overrides (an OverrideStore is read again every 500ms
// while in use, and past maxOverrides a Limiter is made per request).
type decideOnly struct{ sluice.Store }

// OverrideSubject returns what a tenant plan (sluice.Override) must name
// to reach the descriptor of domain with entries as this service decides
// it: the policy of the rule that matches it, the subject this service
// checks (the pseudonym of the entries the rule does not fix) and the
// subject under older keys during a rotation. For an in-flight rule the
// last entry names a lease, not the subject: its value is left out. The
// error says why no plan can reach it: an unknown domain, no rule, or a
// rule the store does not decide (unlimited, 0 per unit); it names the
// entries by their keys, never their values.
func (st *State) OverrideSubject(domain string, entries []rules.Entry) (policy, subject string, previous []string, err error) {
	if !st.Rules.HasDomain(domain) {
		return "", "", nil, fmt.Errorf("domain %q: no rules file holds it", domain)
	}
	r, vars := st.Rules.Match(domain, entries)
	switch {
	case r == nil:
		return "", "", nil, fmt.Errorf("descriptor %s: no rule of domain %q matches it", describe(entries), domain)
	case !r.Decided():
		return "", "", nil, fmt.Errorf("descriptor %s: its rule %s is unlimited or allows 0, so no store decides it", describe(entries), r.Key)
	case r.InFlight:
		vars = vars[:len(vars)-1]
	}
	id := identity(vars)
	return r.Policy.ID, st.Pseudonymizer.Pseudonym(SubjectKind, id, domain), st.Pseudonymizer.Previous(SubjectKind, id, domain), nil
}

// describe writes entries by their keys, for an operator's message: a
// value names a tenant, so it never reaches an error, a log line or an
// answer.
func describe(entries []rules.Entry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.Key + "=…"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
