package server

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// The RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers are Structured Field lists
// (RFC 9651) of policy names with parameters:
//
//	RateLimit-Policy: "demo";q=3;w=10
//	RateLimit: "demo";r=2;t=10
//
// q is the quota (the policy's Limit), w the window in seconds, r what
// remains now and t the seconds until the quota is whole again, rounded up.
// w is left out when the window is not a whole number of seconds, since
// the draft allows only integers there. For token_bucket and gcra, q and w
// state the refill rate (Limit per Window) while r counts against the
// burst, which is also the answer's "limit".

// appendPolicyItem appends p's RateLimit-Policy list member.
func appendPolicyItem(b []byte, p *sluice.Policy) []byte {
	b = appendSFString(b, p.ID)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, p.Limit, 10)
	if p.Window%time.Second == 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, int64(p.Window/time.Second), 10)
	}
	return b
}

// appendLimitItem appends st's RateLimit list member.
func appendLimitItem(b []byte, st *sluice.Status) []byte {
	b = appendSFString(b, st.Policy)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(st.Remaining, 0), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, ceilDiv(st.ResetAfter, time.Second), 10)
}

// appendSFString appends s as a Structured Field String (RFC 9651 §4.1.6).
// Policy IDs are validated to [A-Za-z0-9_.-], so the escapes never fire in
// practice; anything outside printable ASCII is dropped rather than sent
// as an invalid field.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
