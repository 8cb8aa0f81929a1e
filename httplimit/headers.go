package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
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
// configured) for a decided outcome.
func (m *Middleware) setStatusHeaders(h http.Header, o sluice.Outcome) {
	h.Set("RateLimit", string(ratelimitheader.AppendLimitField(nil, o)))
	if m.legacy {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(o.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(o.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ratelimitheader.CeilSeconds(o.ResetAfter), 10))
	}
}
