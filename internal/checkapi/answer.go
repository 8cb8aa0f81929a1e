package checkapi

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
)

// AppendAnswer appends to b the Answer for o, with reason as its reason,
// and a newline: the bytes encoding/json writes for that Answer (with
// HTML escaping off), written by hand because the server writes one per
// check.
func AppendAnswer(b []byte, o *sluice.Outcome, reason string) []byte {
	b = append(b, `{"outcome":`...)
	b = appendString(b, o.Kind.String())
	b = appendVerdict(b, &o.Status)
	b = append(b, `,"reason":`...)
	b = appendString(b, reason)
	if o.Cause != 0 {
		b = append(b, `,"cause":`...)
		b = appendString(b, o.Cause.String())
	}
	b = append(b, `,"replayed":`...)
	b = strconv.AppendBool(b, o.Replayed)
	if o.Local {
		b = append(b, `,"local":true`...)
	}
	if o.Lease.ID != "" {
		b = append(b, `,"lease_id":`...)
		b = appendString(b, o.Lease.ID)
	}
	if len(o.Statuses) > 0 {
		b = append(b, `,"statuses":[`...)
		for i := range o.Statuses {
			st := &o.Statuses[i]
			if i > 0 {
				b = append(b, ',')
			}
			kind := sluice.Denied
			if st.Allowed {
				kind = sluice.Allowed
			}
			b = append(b, `{"policy":`...)
			b = appendString(b, st.Policy)
			b = append(b, `,"outcome":`...)
			b = appendString(b, kind.String())
			b = appendVerdict(b, st)
			b = append(b, `,"reason":""}`...)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

// appendVerdict appends the fields of st's Verdict, each after a comma.
func appendVerdict(b []byte, st *sluice.Status) []byte {
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, st.Allowed)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, st.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, st.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, ceilMS(st.ResetAfter), 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, ceilMS(st.RetryAfter), 10)
	b = append(b, `,"approximate":`...)
	b = strconv.AppendBool(b, st.Approximate)
	if st.Delay > 0 {
		b = strconv.AppendInt(append(b, `,"delay_ms":`...), ceilMS(st.Delay), 10) // a book's, omitted when 0 as encoding/json omits it
	}
	if st.Charged != 0 || st.GivenBack != 0 || st.Owed != 0 {
		// A settle's; written as encoding/json writes omitempty fields.
		for _, f := range [...]struct {
			name string
			v    int64
		}{{`,"charged":`, st.Charged}, {`,"given_back":`, st.GivenBack}, {`,"owed":`, st.Owed}} {
			if f.v != 0 {
				b = strconv.AppendInt(append(b, f.name...), f.v, 10)
			}
		}
	}
	return b
}

// ceilMS returns d in whole milliseconds rounded up, and 0 for d ≤ 0.
func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD;
// U+2028 and U+2029 are escaped so the output is also valid JavaScript.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
