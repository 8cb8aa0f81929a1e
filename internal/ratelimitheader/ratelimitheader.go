// Package ratelimitheader serializes the RateLimit-Policy and RateLimit
// fields of draft-ietf-httpapi-ratelimit-headers and the Retry-After
// value: the one serializer of these fields in this module, shared by the
// httplimit middleware and the check API of sluice serve.
//
// The fields are RFC 9651 Lists of policy names (Strings) with Integer
// parameters:
//
//	RateLimit-Policy: "demo";q=3;w=10
//	RateLimit: "demo";r=2;t=10
//
// q is the quota and w the seconds it spans (for most algorithms the
// policy's Limit and Window; see below); r is what remains now and t the seconds until the quota is whole again,
// rounded up. The draft makes w optional and allows only Integers there,
// so w is left out when the window is not a whole number of seconds:
// rounding 1 per 1.5ms up to "1 per 1s" would advertise a quota far
// below the real one.
//
// q is the same number as Status.Limit and the check API's JSON "limit"
// for every algorithm: the most r can be. For fixed_window, sliding_log
// and sliding_window that is the policy's Limit, per Window. For
// token_bucket and gcra it is the bucket, Burst, and w the time an empty
// bucket takes to fill again (Burst × Window / Limit), so that q per w is
// still the refill rate: gcra 10 per 1s with burst 5 is q=5 (w, 0.5s, is
// left out: not whole seconds); with burst 20 it is q=20;w=2. A
// concurrency policy is q=Limit leases with no w.
package ratelimitheader

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// AppendPolicyItem appends p's RateLimit-Policy list member to b, e.g.
// "demo";q=3;w=10. Join several with ", ".
func AppendPolicyItem(b []byte, p sluice.Policy) []byte {
	p = evaluation.Defaults(p)
	b = appendSFString(b, p.ID)
	q, w := p.Limit, p.Window
	if p.Algorithm == sluice.TokenBucket || p.Algorithm == sluice.GCRA {
		// Burst × Window in µs stays below 2^53 (Policy.Validate), so the
		// product fits; w is whole seconds only when it divides exactly.
		q, w = p.Burst, 0
		if fill := p.Window.Microseconds() * p.Burst; p.Limit > 0 && fill%(p.Limit*1e6) == 0 {
			w = time.Duration(fill/(p.Limit*1e6)) * time.Second
		}
	}
	b = append(b, ";q="...)
	b = appendSFInteger(b, q)
	if w > 0 && w%time.Second == 0 {
		b = append(b, ";w="...)
		b = appendSFInteger(b, int64(w/time.Second))
	}
	return b
}

// AppendLimitItem appends s's RateLimit list member to b, e.g.
// "demo";r=2;t=10.
func AppendLimitItem(b []byte, s sluice.Status) []byte {
	b = appendSFString(b, s.Policy)
	b = append(b, ";r="...)
	b = appendSFInteger(b, max(s.Remaining, 0))
	b = append(b, ";t="...)
	return appendSFInteger(b, CeilSeconds(s.ResetAfter))
}

// AppendLimitField appends the RateLimit field value of a decided
// outcome to b: the most restrictive policy (o.Status) first, so a client
// that reads one member reads the one that binds, then the request's
// other policies in request order.
func AppendLimitField(b []byte, o sluice.Outcome) []byte {
	b = AppendLimitItem(b, o.Status)
	for _, s := range o.Statuses {
		if s.Policy != o.Policy {
			b = append(b, ", "...)
			b = AppendLimitItem(b, s)
		}
	}
	return b
}

// RetryAfterSeconds is the Retry-After value for a wait of d: whole
// seconds, rounded up so a client never retries too early, and at least
// 1.
func RetryAfterSeconds(d time.Duration) int64 { return max(CeilSeconds(d), 1) }

// CeilSeconds rounds d up to whole seconds; negative durations are 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// The range of an RFC 9651 Integer.
const sfMaxInt = 999_999_999_999_999

// appendSFInteger serializes n as an RFC 9651 Integer (section 4.1.4),
// clamped to the range the format allows.
func appendSFInteger(b []byte, n int64) []byte {
	return strconv.AppendInt(b, min(max(n, -sfMaxInt), sfMaxInt), 10)
}

// appendSFString serializes s as an RFC 9651 String (section 4.1.6):
// quoted, with '"' and '\' escaped. Bytes outside printable ASCII cannot be
// represented and are replaced by '?'; policy IDs never contain them.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
