package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// quotaExceededType is the problem type of a 429 answer, defined by
// draft-ietf-httpapi-ratelimit-headers: its extension member
// "violated-policies" lists the IDs of the policies that denied.
const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// Problem is the problem body of a's refusal: 429 of the draft's
// quota-exceeded type listing the violated policies, or 503.
func (a *Action) Problem() Problem {
	if a.Kind == Limit {
		return Problem{
			Type:             quotaExceededType,
			Title:            "Request cannot be satisfied as assigned quota has been exceeded",
			Status:           http.StatusTooManyRequests,
			Detail:           fmt.Sprintf("Too many requests; retry in %d s.", a.RetryAfter),
			ViolatedPolicies: Violated(a.Decided()),
		}
	}
	return Problem{
		Type:   "about:blank",
		Title:  "Service Unavailable",
		Status: http.StatusServiceUnavailable,
		Detail: "The rate limiter could not decide; retry shortly.",
	}
}

// WriteProblem answers p as application/problem+json.
func WriteProblem(w http.ResponseWriter, p Problem) {
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
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
