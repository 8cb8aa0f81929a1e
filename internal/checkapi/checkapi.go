// Package checkapi declares the JSON of sluice serve's check API once, for
// the three that speak it: the server (internal/server), the Go client
// (sluiceclient) and sluice check. A field declared here exists in all
// three.
//
// POST /v1/check, /v1/release and /v1/renew take a Request:
//
//	{"policy":"demo","subject":"alice","cost":2,"evaluation_id":"order-42"}
//
// ("policies":["a","b"] in place of "policy" for several at once, all or
// nothing; "refund": true gives cost units back; "reset": true clears the
// subject's state; an explicit "cost": 0 is a peek; "op": "estimate"
// spends cost as an estimate under the evaluation_id, "op": "settle"
// replaces it with the actual cost, 0 included; "op": "book" books the
// next slot for cost, waiting up to "max_wait_ms", answered with its
// "delay_ms"; a release or renewal names its "lease_id"), and answer an
// Answer:
//
//	{"outcome":"denied","allowed":false,"limit":3,"remaining":0,
//	 "reset_after_ms":7500,"retry_after_ms":7500,"approximate":false,
//	 "reason":"","replayed":false}
//
// with "cause" when unavailable, "lease_id" when a lease is held and
// "statuses" when several policies were named. The HTTP status says what
// the outcome is: StatusCode maps one way, Outcome the other.
//
// The conversions each side needs live here too: Encode turns a
// sluice.Request into a Request (the client), Request.Check and
// Request.Lease turn a Request back into the operation it asks for (the
// server, which then pseudonymizes the subject and chooses Acquire when a
// named policy is a concurrency one: that needs its Limiter),
// AppendAnswer writes an Outcome's Answer (the server) and Outcome reads
// it back (the client).
package checkapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policyerr"
)

// The check API's paths.
const (
	CheckPath   = "/v1/check"   // every operation but a release or a renewal
	ReleasePath = "/v1/release" // sluice.Release
	RenewPath   = "/v1/renew"   // sluice.Renew
)

// MaxSubjectLen is the longest raw subject the check API accepts, in
// bytes. The pseudonym the Limiter sees has a fixed length whatever the
// subject.
const MaxSubjectLen = 1024

// Request is the body of POST /v1/check, /v1/release and /v1/renew. Cost
// is a pointer: an absent cost means 1, an explicit 0 a peek.
type Request struct {
	Policy       string   `json:"policy,omitempty"`
	Policies     []string `json:"policies,omitempty"`
	Subject      string   `json:"subject"`
	Cost         *int64   `json:"cost,omitempty"`
	Refund       bool     `json:"refund,omitempty"`
	Reset        bool     `json:"reset,omitempty"`
	EvaluationID string   `json:"evaluation_id,omitempty"`
	LeaseID      string   `json:"lease_id,omitempty"` // /v1/release and /v1/renew only
	// Op is "estimate", "settle" or "book" (sluice.Estimate,
	// sluice.Settle, sluice.Book), or "" for what the fields above ask.
	Op string `json:"op,omitempty"`
	// Priority is the request's priority class (sluice.Request.Priority),
	// e.g. "sheddable"; "" is the default class. /v1/release takes none.
	Priority string `json:"priority,omitempty"`
	// MaxWaitMS is a book's bound (sluice.Request.MaxWait), 1 or more
	// whole milliseconds; absent: the policy's max_wait.
	MaxWaitMS *int64 `json:"max_wait_ms,omitempty"`
}

// RequestError is a request the check API refuses as malformed, before
// any Limiter sees it: the server answers it 400 with Reason as the
// answer's reason. It matches sluice.ErrInvalidRequest with errors.Is.
type RequestError struct {
	// Reason names the field, its value and the rule, e.g.
	// "cost = -1: must not be negative".
	Reason string
}

func (e *RequestError) Error() string { return "checkapi: invalid request: " + e.Reason }

// Unwrap returns sluice.ErrInvalidRequest.
func (e *RequestError) Unwrap() error { return sluice.ErrInvalidRequest }

func malformed(format string, args ...any) *RequestError {
	return &RequestError{Reason: fmt.Sprintf(format, args...)}
}

// Encode returns the Request that asks for req and the path it is posted
// to. req.Subject is the raw identity, which the server pseudonymizes. An
// Acquire is sent as a plain check (the server acquires when a named
// policy is a concurrency one); a Spend or a Refund whose Cost is 0 asks
// for 1, as the Limiter reads it. What the check API cannot carry is a
// *RequestError: a Peek with a cost, a lease id on anything but a release
// or a renewal (the server names an acquisition's lease), a release or a
// renewal without one. What it can carry the server judges.
func Encode(req sluice.Request) (Request, string, error) {
	r := Request{Policy: req.Policy, Policies: req.Policies, Subject: req.Subject, EvaluationID: req.EvaluationID}
	if req.Op != sluice.Release {
		r.Priority = req.Priority // a release gives back: the Limiter ignores a class there
	}
	switch {
	case req.Subject == "":
		return Request{}, "", malformed("subject is required")
	case len(req.Subject) > MaxSubjectLen:
		return Request{}, "", malformed("subject is %d bytes: must be at most %d", len(req.Subject), MaxSubjectLen)
	case req.Cost < 0:
		return Request{}, "", malformed("cost = %d: must not be negative", req.Cost)
	case req.Op == sluice.Peek && req.Cost != 0:
		return Request{}, "", malformed("cost = %d: a peek takes no cost, leave it 0", req.Cost)
	case (req.Op == sluice.Release || req.Op == sluice.Renew) && req.LeaseID == "":
		return Request{}, "", malformed("lease id is required: a %v names the lease an acquire was answered", req.Op)
	case req.Op != sluice.Release && req.Op != sluice.Renew && req.LeaseID != "":
		return Request{}, "", malformed("lease id %q: only a release or a renewal names one: the server names the lease an acquire takes", req.LeaseID)
	case req.Op > sluice.Renew && req.Op != sluice.Estimate && req.Op != sluice.Settle && req.Op != sluice.Book:
		return Request{}, "", malformed("op = %v: not an operation of the check API", req.Op)
	case req.MaxWait != 0 && (req.MaxWait < 0 || req.MaxWait%time.Millisecond != 0):
		return Request{}, "", malformed("max wait = %v: the check API carries a whole number of milliseconds, 1ms or more", req.MaxWait)
	case req.MaxWait != 0 && req.Op != sluice.Book:
		return Request{}, "", malformed("max wait = %v: only a book waits, not %v", req.MaxWait, req.Op)
	}
	if req.Cost > 0 || req.Op == sluice.Settle {
		r.Cost = &req.Cost // a settle's actual cost, 0 included
	}
	path := CheckPath
	switch req.Op {
	case sluice.Peek:
		r.Cost = new(int64)
	case sluice.Refund:
		r.Refund = true
	case sluice.Reset:
		r.Reset = true
	case sluice.Release:
		path, r.LeaseID = ReleasePath, req.LeaseID
	case sluice.Renew:
		path, r.LeaseID = RenewPath, req.LeaseID
	case sluice.Estimate, sluice.Settle:
		r.Op = req.Op.String()
	case sluice.Book:
		r.Op = req.Op.String()
		if req.MaxWait != 0 {
			ms := int64(req.MaxWait / time.Millisecond)
			r.MaxWaitMS = &ms
		}
	}
	return r, path, nil
}

// Check returns what r, the body of POST /v1/check, asks for: a Reset, a
// Refund, a Peek (an explicit cost of 0) or else a Spend, with r's fields;
// Subject is the raw one. Choosing Acquire when a named policy is a
// concurrency one is the caller's (it knows the policies), as is
// pseudonymizing the subject. A malformed r is a *RequestError.
func (r *Request) Check() (sluice.Request, error) {
	if err := r.validate(); err != nil {
		return sluice.Request{}, err
	}
	switch {
	case r.Refund && r.Reset:
		return sluice.Request{}, malformed("set refund or reset, not both")
	case r.Refund && r.Cost != nil && *r.Cost == 0:
		return sluice.Request{}, malformed("cost = 0 with refund: a peek or a refund, not both: a refund gives back a cost of 1 or more")
	case r.LeaseID != "":
		return sluice.Request{}, malformed("lease_id belongs to POST %s and %s; a check acquires a new lease", ReleasePath, RenewPath)
	}
	req := sluice.Request{Policy: r.Policy, Policies: r.Policies, Subject: r.Subject, EvaluationID: r.EvaluationID, Priority: r.Priority}
	switch {
	case r.Op == sluice.Book.String():
		return r.book(req)
	case r.MaxWaitMS != nil:
		return sluice.Request{}, malformed("max_wait_ms = %d: only a book waits: set op to book", *r.MaxWaitMS)
	case r.Op != "":
		return r.settle(req)
	}
	switch {
	case r.Reset:
		req.Op = sluice.Reset
	case r.Refund:
		req.Op = sluice.Refund
	case r.Cost != nil && *r.Cost == 0:
		req.Op = sluice.Peek
	}
	if r.Cost != nil {
		req.Cost = *r.Cost // a reset's is refused by the Limiter's store
	}
	return req, nil
}

// Lease returns what r, the body of POST /v1/release (op sluice.Release)
// or /v1/renew (sluice.Renew), asks for: op on the lease r.LeaseID. It
// takes policy (or policies), subject and lease_id only. A malformed r is
// a *RequestError.
func (r *Request) Lease(op sluice.Op) (sluice.Request, error) {
	if err := r.validate(); err != nil {
		return sluice.Request{}, err
	}
	switch {
	case r.LeaseID == "":
		return sluice.Request{}, malformed("lease_id is required: the one %s answered", CheckPath)
	case r.Cost != nil || r.Refund || r.Reset || r.EvaluationID != "" || r.Op != "" || r.MaxWaitMS != nil:
		return sluice.Request{}, malformed("a release or renewal takes policy (or policies), subject and lease_id only (and a renewal its priority)")
	case r.Priority != "" && op == sluice.Release:
		return sluice.Request{}, malformed("priority = %q: a release gives its lease back whatever the class; leave it out", r.Priority)
	}
	return sluice.Request{Op: op, Policy: r.Policy, Policies: r.Policies, Subject: r.Subject, LeaseID: r.LeaseID, Priority: r.Priority}, nil
}

// validate checks what every path requires of r.
func (r *Request) validate() error {
	switch {
	case r.Subject == "":
		return malformed("subject is required")
	case len(r.Subject) > MaxSubjectLen:
		return malformed("subject is %d bytes: must be at most %d", len(r.Subject), MaxSubjectLen)
	case r.Cost != nil && *r.Cost < 0:
		return malformed("cost = %d: must not be negative", *r.Cost)
	case r.Policy == "" && len(r.Policies) == 0:
		return malformed("policy is required (or policies)")
	case r.Policy != "" && len(r.Policies) > 0:
		return malformed("set policy or policies, not both")
	}
	return nil
}

// Verdict is one policy's numbers in an Answer: a sluice.Status, its
// durations in whole milliseconds rounded up.
type Verdict struct {
	Allowed      bool  `json:"allowed"`
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	ResetAfterMS int64 `json:"reset_after_ms"`
	RetryAfterMS int64 `json:"retry_after_ms"`
	Approximate  bool  `json:"approximate"`
	// DelayMS is an allowed book's wait until its slot
	// (sluice.Status.Delay), rounded up; absent when it was admitted now.
	DelayMS int64 `json:"delay_ms,omitempty"`
	// Charged, GivenBack and Owed are a settle's (sluice.Status), present
	// on a settle's answer only.
	Charged   int64 `json:"charged,omitempty"`
	GivenBack int64 `json:"given_back,omitempty"`
	Owed      int64 `json:"owed,omitempty"`
}

// Status is one policy's part of an Answer that names several: its
// outcome is allowed or denied, its reason always "".
type Status struct {
	Policy  string `json:"policy"`
	Outcome string `json:"outcome"`
	Verdict
	Reason string `json:"reason"`
}

// Answer is the answer of POST /v1/check, /v1/release and /v1/renew. The
// top-level Verdict is the most restrictive policy's.
type Answer struct {
	// Outcome is a sluice.Kind's spelling: allowed, denied, unavailable,
	// incompatible or indeterminate.
	Outcome string `json:"outcome"`
	Verdict
	// Reason says why there is no decision; "" for allowed and denied.
	Reason string `json:"reason"`
	// Cause is a sluice.Cause's spelling, e.g. "circuit_open", when the
	// outcome is unavailable.
	Cause string `json:"cause,omitempty"`
	// Replayed is always present: true when the answer is the remembered
	// first decision of the request's evaluation_id.
	Replayed bool `json:"replayed"`
	// Local is true when the server admitted the check from a block of
	// local quota (the policy's local_quota), without a store call.
	Local bool `json:"local,omitempty"`
	// LeaseID is the lease an allowed acquire or renewal holds.
	LeaseID string `json:"lease_id,omitempty"`
	// Statuses holds one Status per policy, in request order, when the
	// request named several.
	Statuses []Status `json:"statuses,omitempty"`
}

// StatusCode returns the HTTP status of o's answer: 200 allowed, 429
// denied, 503 unavailable or indeterminate, 404 an unknown policy, 422
// an unknown priority class, 400 another invalid request, 422 any other
// incompatible one.
func StatusCode(o *sluice.Outcome) int {
	switch o.Kind {
	case sluice.Allowed:
		return http.StatusOK
	case sluice.Denied:
		return http.StatusTooManyRequests
	case sluice.Unavailable, sluice.Indeterminate:
		return http.StatusServiceUnavailable
	}
	switch {
	case errors.Is(o.Err, policyerr.ErrUnknownPolicy):
		return http.StatusNotFound
	case errors.Is(o.Err, algorithm.ErrUnknownClass):
		return http.StatusUnprocessableEntity // well formed: the policies declare no such class
	case errors.Is(o.Err, sluice.ErrInvalidRequest):
		return http.StatusBadRequest
	}
	return http.StatusUnprocessableEntity
}

// Outcome returns the sluice.Outcome that a, answered with HTTP status
// code to req, stands for: the inverse of StatusCode and AppendAnswer.
// Err wraps the library's sentinel the answer stands for (errors.Is works
// as on a Limiter's outcomes) followed by the server's reason; its text
// carries no package prefix, for the caller to add its own. An allowed
// answer's lease_id becomes Lease, held for req.Subject on the policies
// req names. Statuses 401 and 403 are the caller's to read: their
// sentinels are its own.
func Outcome(code int, a *Answer, req *sluice.Request) sluice.Outcome {
	switch code {
	case http.StatusOK, http.StatusTooManyRequests:
		return a.decision(req)
	case http.StatusBadRequest:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: a.wrap(sluice.ErrInvalidRequest)}
	case http.StatusNotFound:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: a.wrap(policyerr.ErrUnknownPolicy)}
	}
	switch a.Outcome {
	case sluice.Indeterminate.String():
		return sluice.Outcome{Kind: sluice.Indeterminate, Err: a.wrap(sluice.ErrIndeterminate)}
	case sluice.Unavailable.String():
		cause := parseCause(a.Cause)
		return sluice.Outcome{Kind: sluice.Unavailable, Cause: cause, Err: fmt.Errorf("server could not decide: %w", a.wrap(causeErrs[cause]))}
	}
	// 422: the reason carries the library's error text; name its sentinel.
	for _, sentinel := range []error{algorithm.ErrCostTooHigh, algorithm.ErrNotRefundable, sluice.CorruptState, sluice.ErrInvalidRequest, policyerr.ErrUnknownPolicy} {
		if strings.Contains(a.Reason, sentinel.Error()) {
			return sluice.Outcome{Kind: sluice.Incompatible, Err: a.wrap(sentinel)}
		}
	}
	return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("%d: %s", code, a.Reason)}
}

// decision returns the allowed or denied outcome a stands for.
func (a *Answer) decision(req *sluice.Request) sluice.Outcome {
	o := sluice.Outcome{Kind: sluice.Allowed, Status: a.Verdict.status(req.Policy), Replayed: a.Replayed, Local: a.Local}
	if !a.Allowed {
		o.Kind = sluice.Denied
	}
	if a.LeaseID != "" {
		o.Lease = sluice.Lease{ID: a.LeaseID, Subject: req.Subject, Policies: req.Policies}
		if req.Policy != "" {
			o.Lease.Policies = []string{req.Policy}
		}
	}
	if len(a.Statuses) == 0 {
		return o
	}
	o.Statuses = make([]sluice.Status, len(a.Statuses))
	for i := range a.Statuses {
		o.Statuses[i] = a.Statuses[i].status(a.Statuses[i].Policy)
	}
	// The top-level fields are the most restrictive policy's: name it.
	for _, s := range o.Statuses {
		if s.Allowed == o.Allowed && s.Limit == o.Limit && s.Remaining == o.Remaining && s.ResetAfter == o.ResetAfter && s.RetryAfter == o.RetryAfter && s.Delay == o.Delay {
			o.Policy = s.Policy
			break
		}
	}
	return o
}

// wrap returns sentinel (nil: none) followed by a's reason.
func (a *Answer) wrap(sentinel error) error {
	switch {
	case sentinel == nil:
		return errors.New(a.Reason)
	case a.Reason == "":
		return sentinel
	}
	return fmt.Errorf("%w: %s", sentinel, a.Reason)
}

// status returns v as policy's sluice.Status.
func (v *Verdict) status(policy string) sluice.Status {
	return sluice.Status{
		Policy:      policy,
		Allowed:     v.Allowed,
		Limit:       v.Limit,
		Remaining:   v.Remaining,
		ResetAfter:  time.Duration(v.ResetAfterMS) * time.Millisecond,
		RetryAfter:  time.Duration(v.RetryAfterMS) * time.Millisecond,
		Approximate: v.Approximate,
		Delay:       time.Duration(v.DelayMS) * time.Millisecond,
		Charged:     v.Charged,
		GivenBack:   v.GivenBack,
		Owed:        v.Owed,
	}
}

// causeErrs are the sentinels a Limiter's Unavailable outcome of each
// Cause wraps.
var causeErrs = [...]error{
	sluice.DeadlinePassed:   context.DeadlineExceeded,
	sluice.FailedBeforeSend: sluice.FailedBeforeSend,
	sluice.ClockUnsafe:      sluice.ClockUnsafe,
	sluice.CircuitOpen:      sluice.CircuitOpen,
	sluice.CorruptState:     sluice.CorruptState,
}

// parseCause returns the Cause spelt name, or 0 for none or one this
// package does not know (a newer server's).
func parseCause(name string) sluice.Cause {
	for c := sluice.DeadlinePassed; int(c) < len(causeErrs); c++ {
		if c.String() == name {
			return c
		}
	}
	return 0
}

// ParseAnswer decodes raw, the body of an answer, as an Answer: an error
// when it is not one (not JSON, or no outcome: a page of something other
// than the check API at the URL).
func ParseAnswer(raw []byte) (Answer, error) {
	var a Answer
	if err := json.Unmarshal(raw, &a); err != nil {
		return Answer{}, fmt.Errorf("checkapi: not a check API answer: %w", err)
	}
	if a.Outcome == "" {
		return Answer{}, errors.New("checkapi: not a check API answer: no outcome")
	}
	return a, nil
}
