package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
)

// Kind is what an edge does with a request.
type Kind uint8

// The kinds of Action.
const (
	undecided Kind = iota
	// Admit: the request goes on (the Limiter or the local fallback
	// admitted it).
	Admit
	// Limit: the request is refused, 429 with Retry-After.
	Limit
	// FailOpen: no decision, and the rule fails open: the request goes on.
	FailOpen
	// FailClosed: no decision (nor from the local fallback), and the rule
	// fails closed: 503 with Retry-After: 1.
	FailClosed
)

var kindNames = [...]string{Admit: "admitted", Limit: "limited", FailOpen: "failed_open", FailClosed: "failed_closed"}

// String is the kind's log and metric spelling, e.g. "failed_closed".
func (k Kind) String() string {
	if k >= Admit && k <= FailClosed {
		return kindNames[k]
	}
	return "undecided"
}

// Action is what the Core decided for one request.
type Action struct {
	// Kind is what the edge is to do.
	Kind Kind
	// Outcome is the Limiter's.
	Outcome sluice.Outcome
	// Local reports that the Limiter could not decide and the local
	// fallback was asked; LocalOutcome is its answer.
	Local        bool
	LocalOutcome sluice.Outcome
	// Status is the HTTP status of the answer: 0 when the request goes on,
	// 429 limited, 503 failed closed.
	Status int
	// RetryAfter is the Retry-After of a refusal in whole seconds, rounded
	// up, at least 1; 0 when the request goes on.
	RetryAfter int64
	// Limit is the RateLimit field of the deciding outcome, e.g.
	// `"login";r=2;t=60`; "" when nothing was decided.
	Limit string
}

// Decided is the outcome that decided: the local fallback's when it was
// asked, else the Limiter's.
func (a *Action) Decided() *sluice.Outcome {
	if a.Local {
		return &a.LocalOutcome
	}
	return &a.Outcome
}

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
