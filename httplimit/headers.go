package httplimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
)

// quotaExceededType is the problem type of a 429 answer, defined by
// draft-ietf-httpapi-ratelimit-headers: its extension member
// "violated-policies" lists the IDs of the policies that denied.
const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

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

// writeRefusal writes the built-in answer of status (429, 503 or 403),
// retry the 429's Retry-After seconds and decided its outcome.
func writeRefusal(w http.ResponseWriter, status int, retry int64, decided sluice.Outcome) {
	switch status {
	case http.StatusTooManyRequests:
		writeProblem(w, status, problem{
			Type:             quotaExceededType,
			Title:            "Request cannot be satisfied as assigned quota has been exceeded",
			Status:           status,
			Detail:           fmt.Sprintf("Too many requests; retry in %d s.", retry),
			ViolatedPolicies: violated(decided),
		})
	case http.StatusServiceUnavailable:
		writeProblem(w, status, problem{
			Type:   "about:blank",
			Title:  "Service Unavailable",
			Status: status,
			Detail: "The rate limiter could not decide; retry shortly.",
		})
	case http.StatusForbidden:
		writeProblem(w, status, problem{
			Type:   "about:blank",
			Title:  "Forbidden",
			Status: status,
			Detail: "The request carries no identity this endpoint can be rate limited by.",
		})
	}
}

// violated lists the policies that denied o.
func violated(o sluice.Outcome) []string {
	if len(o.Statuses) == 0 {
		return []string{o.Policy}
	}
	var ids []string
	for _, s := range o.Statuses {
		if !s.Allowed {
			ids = append(ids, s.Policy)
		}
	}
	return ids
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
