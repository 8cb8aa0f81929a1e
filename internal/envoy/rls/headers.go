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
