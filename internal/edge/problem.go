package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/internal/ratelimitheader"
	"time"
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

// datedWait is the longest wait said in seconds; a longer one (a
// monthly quota's) is said as the date it ends.
const datedWait = time.Hour

// RetryWhen says when a request refused for wait may be retried, for
// people to read ("retry in 2101333 s." is not read): "in 8 s" (whole
// seconds rounded up, at least 1, as Retry-After) up to an hour, past it
// "after 2026-04-01T00:00:00Z", the instant on c's clock, RFC 3339 in UTC
// rounded up to the second.
func (c *Core) RetryWhen(wait time.Duration) string {
	secs := ratelimitheader.RetryAfterSeconds(wait)
	if time.Duration(secs)*time.Second <= datedWait {
		return fmt.Sprintf("in %d s", secs)
	}
	at := c.clock.Now().Add(wait)
	if t := at.Truncate(time.Second); t.Before(at) {
		at = t.Add(time.Second) // never earlier than the wait
	}
	return "after " + at.UTC().Format(time.RFC3339)
}

// Problem is the problem body of a's refusal: 429 of the draft's
// quota-exceeded type listing the violated policies, its detail saying
// when to retry (RetryWhen; Retry-After stays in seconds), or 503.
func (c *Core) Problem(a *Action) Problem {
	if a.Kind == Limit {
		return Problem{
			Type:             quotaExceededType,
			Title:            "Request cannot be satisfied as assigned quota has been exceeded",
			Status:           http.StatusTooManyRequests,
			Detail:           "Too many requests; retry " + c.RetryWhen(retryAfter(a.Decided())) + ".",
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
