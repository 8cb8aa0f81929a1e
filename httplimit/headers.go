package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
)

// QuotaExceededType is the problem type of a 429 answer, defined by
// draft-ietf-httpapi-ratelimit-headers: its extension member
// "violated-policies" lists the IDs of the policies that denied.
const QuotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problem is an RFC 9457 problem detail.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, p problem) {
	body, err := json.Marshal(p)
	if err != nil { // strings and ints only: cannot happen
		body = []byte(`{"type":"about:blank"}`)
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Del("Content-Encoding")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// setStatusHeaders writes the RateLimit field (and the legacy ones when
// configured) for a decided outcome: the most restrictive policy first,
// then the route's others in order.
func (m *Middleware) setStatusHeaders(h http.Header, o sluice.Outcome) {
	items := []sfItem{statusItem(o.Status)}
	for _, s := range o.Statuses {
		if s.Policy != o.Policy {
			items = append(items, statusItem(s))
		}
	}
	h.Set("RateLimit", string(appendSFList(nil, items)))
	if m.legacy {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(o.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(o.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(o.ResetAfter), 10))
	}
}

func statusItem(s sluice.Status) sfItem {
	return sfItem{str: s.Policy, params: []sfParam{{"r", s.Remaining}, {"t", ceilSeconds(s.ResetAfter)}}}
}

// sfItem is an RFC 9651 structured-field list member: a String bare item
// with Integer parameters, e.g. "api";q=100;w=60.
type sfItem struct {
	str    string
	params []sfParam
}

// sfParam is one parameter. key must be an RFC 9651 key (lowercase).
type sfParam struct {
	key string
	val int64
}

// The range of an RFC 9651 Integer.
const sfMaxInt = 999_999_999_999_999

// appendSFList serializes items as an RFC 9651 List (section 4.1.1).
func appendSFList(b []byte, items []sfItem) []byte {
	for i, it := range items {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendSFString(b, it.str)
		for _, p := range it.params {
			b = append(b, ';')
			b = append(b, p.key...)
			b = append(b, '=')
			b = strconv.AppendInt(b, min(max(p.val, -sfMaxInt), sfMaxInt), 10)
		}
	}
	return b
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
