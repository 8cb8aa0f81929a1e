package rls

import (
	"strconv"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
)

// oneHeaders is headers for the common request, where at most one
// descriptor was decided by the store: the same header values, written
// into one buffer sized for them and converted once, without headers'
// map and slices, the header values rp's. It reports false when more
// than one was decided.
func oneHeaders(ds []descriptor, over bool, rp *reply) ([]*corepb.HeaderValue, bool) {
	var one *descriptor
	for i := range ds {
		if ds[i].decided != nil {
			if one != nil {
				return nil, false
			}
			one = &ds[i]
		}
	}
	if one == nil {
		return nil, true
	}
	st := one.decided
	b := make([]byte, 0, 128)
	b = ratelimitheader.AppendPolicyItem(b, one.rule.Policy)
	n := len(b)
	b = ratelimitheader.AppendLimitField(b, sluice.Outcome{Status: *st})
	s := string(b)
	h := &rp.header
	h[0].Key, h[0].Value = "RateLimit-Policy", s[:n]
	h[1].Key, h[1].Value = "RateLimit", s[n:]
	hs := append(rp.headers[:0], &h[0], &h[1])
	if over && !one.rule.Shadow && !st.Allowed {
		h[2].Key, h[2].Value = "Retry-After", strconv.FormatInt(ratelimitheader.RetryAfterSeconds(st.RetryAfter), 10)
		hs = append(hs, &h[2])
	}
	return hs, true
}

// headers returns the RateLimit-Policy and RateLimit fields for the
// rules the store decided, shadow ones included (their answer carries
// what an enforced one would), the most restrictive first, and
// Retry-After from the enforced rules when the request is over the
// limit. This is the one place the service calls the field serializer.
func headers(ds []descriptor, over bool, rp *reply) []*corepb.HeaderValue {
	if hs, ok := oneHeaders(ds, over, rp); ok {
		return hs
	}
	var policies []sluice.Policy
	var statuses, enforced []sluice.Status
	seen := map[string]bool{}
	for i := range ds {
		if d := &ds[i]; d.decided != nil && !seen[d.rule.Policy.ID] {
			seen[d.rule.Policy.ID] = true
			policies = append(policies, d.rule.Policy)
			statuses = append(statuses, *d.decided)
			if !d.rule.Shadow {
				enforced = append(enforced, *d.decided)
			}
		}
	}
	if len(statuses) == 0 {
		return nil
	}
	var pol []byte
	for i, p := range policies {
		if i > 0 {
			pol = append(pol, ", "...)
		}
		pol = ratelimitheader.AppendPolicyItem(pol, p)
	}
	o := sluice.Outcome{Status: mostRestrictive(statuses)}
	if len(statuses) > 1 {
		o.Statuses = statuses
	}
	hs := []*corepb.HeaderValue{
		{Key: "RateLimit-Policy", Value: string(pol)},
		{Key: "RateLimit", Value: string(ratelimitheader.AppendLimitField(nil, o))},
	}
	if over && len(enforced) > 0 {
		if most := mostRestrictive(enforced); !most.Allowed {
			hs = append(hs, &corepb.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ratelimitheader.RetryAfterSeconds(most.RetryAfter), 10)})
		}
	}
	return hs
}

// mostRestrictive picks the status of statuses (at least one) that
// speaks for them all: the denial that lasts longest, else the policy
// closest to exhaustion and, of two as close, the one that resets later.
// It is the root's choice (sluice's mostRestrictive, which picks an
// Outcome's Status among its Statuses), made here across the checks of
// one request; the root's is not exported (its surface is capped), so
// TestMostRestrictiveIsTheRoots holds the two identical.
func mostRestrictive(ss []sluice.Status) sluice.Status {
	best := ss[0]
	for _, s := range ss[1:] {
		switch {
		case best.Allowed && !s.Allowed:
			best = s
		case !best.Allowed && !s.Allowed && s.RetryAfter > best.RetryAfter:
			best = s
		case best.Allowed && s.Allowed && (s.Remaining < best.Remaining || s.Remaining == best.Remaining && s.ResetAfter > best.ResetAfter):
			best = s
		}
	}
	return best
}
