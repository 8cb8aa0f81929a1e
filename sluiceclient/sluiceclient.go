// Package sluiceclient is a Go client for the check API of sluice serve
// (POST /v1/check), for services that share one sluice server instead of
// embedding the library.
//
// Check takes the library's sluice.Request and returns its sluice.Outcome,
// so code written against a Limiter reads the same against a server. The
// difference is the subject: send the raw identity (an account ID, an API
// key); the server pseudonymizes it before it becomes a key.
//
// A spend whose answer is lost (the connection broke after the request
// was written, a timeout, a gateway error) or comes back Indeterminate is
// sent again with the same evaluation ID, a few times: the server answers
// a repeat with the first decision instead of spending twice. Check
// generates an evaluation ID for every spend and refund that has none.
//
// A check of a concurrency policy that is allowed holds a lease
// (Outcome.Lease); Release gives it back (POST /v1/release) and Renew
// extends it (POST /v1/renew). Both are idempotent on the server, so a
// lost answer is simply asked again.
package sluiceclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Defaults of Options.
const (
	DefaultRetries        = 2
	DefaultAttemptTimeout = 2 * time.Second
	DefaultRetryBackoff   = 50 * time.Millisecond
)

// MaxSubjectLen is the longest subject the check API accepts, in bytes.
const MaxSubjectLen = 1024

// Errors in Outcome.Err, besides the sluice.Err… variables; match them
// with errors.Is.
var (
	// ErrUnauthenticated: the server requires a bearer token and
	// Options.Token is missing or wrong (401).
	ErrUnauthenticated = errors.New("sluiceclient: the server requires a valid bearer token")
	// ErrForbidden: the token lacks the scope the request needs, e.g.
	// refund (403).
	ErrForbidden = errors.New("sluiceclient: the token lacks the scope for this request")
)

// Options configure a Client. The zero value means the defaults.
type Options struct {
	// Token is the bearer token sent with every check, one of the
	// server's server.auth.tokens. Default: "", none.
	Token string
	// HTTPClient sends the requests; set it for TLS settings of your own
	// or a proxy. Its Timeout, if any, bounds each attempt too.
	// Default: a client of its own over a clone of http.DefaultTransport.
	HTTPClient *http.Client
	// Retries is how many times a spend or refund whose answer was lost
	// or Indeterminate is sent again, with the same evaluation ID.
	// Negative: never. Default: DefaultRetries (2).
	Retries int
	// AttemptTimeout bounds each attempt, so a hung connection becomes a
	// retry while the context still has time. Default:
	// DefaultAttemptTimeout (2s).
	AttemptTimeout time.Duration
	// RetryBackoff is the pause before the first retry; it doubles for
	// each further one. Default: DefaultRetryBackoff (50ms).
	RetryBackoff time.Duration
}

// Client asks one sluice server. Safe for concurrent use; it owns no
// goroutines. Close releases its idle connections.
type Client struct {
	endpoint string // …/v1/check
	base     string // endpoint without /v1/check
	token    string
	http     *http.Client
	own      bool // http is the Client's own
	retries  int
	attempt  time.Duration
	backoff  time.Duration
}

// New returns a Client for the server at baseURL, e.g.
// "https://sluice.internal:8080"; a URL that already ends in /v1/check is
// taken as it is.
func New(baseURL string, opts Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("sluiceclient: New: base URL %q: must be an http:// or https:// URL with a host", baseURL)
	}
	switch {
	case opts.AttemptTimeout < 0:
		return nil, fmt.Errorf("sluiceclient: New: AttemptTimeout = %v: must not be negative", opts.AttemptTimeout)
	case opts.RetryBackoff < 0:
		return nil, fmt.Errorf("sluiceclient: New: RetryBackoff = %v: must not be negative", opts.RetryBackoff)
	case strings.ContainsAny(opts.Token, " \t\r\n"):
		return nil, errors.New("sluiceclient: New: Token contains white space")
	}
	c := &Client{
		endpoint: strings.TrimSuffix(u.String(), "/"),
		token:    opts.Token,
		http:     opts.HTTPClient,
		retries:  opts.Retries,
		attempt:  opts.AttemptTimeout,
		backoff:  opts.RetryBackoff,
	}
	if !strings.HasSuffix(c.endpoint, "/v1/check") {
		c.endpoint += "/v1/check"
	}
	c.base = strings.TrimSuffix(c.endpoint, "/v1/check")
	if c.http == nil {
		c.http = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		c.own = true
	}
	switch {
	case c.retries == 0:
		c.retries = DefaultRetries
	case c.retries < 0:
		c.retries = 0
	}
	if c.attempt == 0 {
		c.attempt = DefaultAttemptTimeout
	}
	if c.backoff == 0 {
		c.backoff = DefaultRetryBackoff
	}
	return c, nil
}

// Close releases the idle connections of the Client's own HTTP client.
func (c *Client) Close() error {
	if c.own {
		c.http.CloseIdleConnections()
	}
	return nil
}

// body is the JSON of POST /v1/check.
type body struct {
	Policy       string   `json:"policy,omitempty"`
	Policies     []string `json:"policies,omitempty"`
	Subject      string   `json:"subject"`
	Cost         *int64   `json:"cost,omitempty"`
	Refund       bool     `json:"refund,omitempty"`
	Reset        bool     `json:"reset,omitempty"`
	EvaluationID string   `json:"evaluation_id,omitempty"`
	LeaseID      string   `json:"lease_id,omitempty"`
}

// status is one policy's part of the answer.
type status struct {
	Policy       string `json:"policy"`
	Outcome      string `json:"outcome"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Approximate  bool   `json:"approximate"`
	Reason       string `json:"reason"`
}

// answer is the JSON answer of POST /v1/check.
type answer struct {
	status
	Cause    string   `json:"cause"`
	Replayed bool     `json:"replayed"`
	Statuses []status `json:"statuses"`
	LeaseID  string   `json:"lease_id"`
}

// Check asks the server to decide req and returns its outcome. req.Subject
// is the raw identity, which the server pseudonymizes. Like
// sluice.Limiter.Check it never panics and returns no error: a failure is
// an Outcome of kind Incompatible (the request's fault, or a missing
// token: ErrUnauthenticated, ErrForbidden), Unavailable (nothing was
// spent: the server could not decide, or was not reached) or
// Indeterminate (the answer was lost after every retry: the units may
// have been spent), with Err set; an Unavailable answer from the server
// keeps its Cause.
func (c *Client) Check(ctx context.Context, req sluice.Request) sluice.Outcome {
	switch req.Op {
	case sluice.Release, sluice.Renew:
		path := "/v1/release"
		if req.Op == sluice.Renew {
			path = "/v1/renew"
		}
		ids := req.Policies
		if req.Policy != "" {
			ids = []string{req.Policy}
		}
		return c.leaseCall(ctx, path, sluice.Lease{ID: req.LeaseID, Subject: req.Subject, Policies: ids})
	}
	b := body{Policy: req.Policy, Policies: req.Policies, Subject: req.Subject, Refund: req.Op == sluice.Refund, Reset: req.Op == sluice.Reset, EvaluationID: req.EvaluationID}
	peek := req.Op == sluice.Peek
	switch {
	case req.Subject == "":
		return incompatible(sluice.ErrInvalidRequest, "subject is required")
	case len(req.Subject) > MaxSubjectLen:
		return incompatible(sluice.ErrInvalidRequest, fmt.Sprintf("subject is %d bytes: must be at most %d", len(req.Subject), MaxSubjectLen))
	case req.Cost < 0:
		return incompatible(sluice.ErrInvalidRequest, fmt.Sprintf("cost = %d: must not be negative", req.Cost))
	case (peek || b.Reset) && req.Cost != 0:
		return incompatible(sluice.ErrInvalidRequest, fmt.Sprintf("cost = %d: a %v spends nothing, leave cost 0", req.Cost, req.Op))
	}
	switch {
	case peek:
		zero := int64(0)
		b.Cost = &zero
	case req.Cost > 0:
		b.Cost = &req.Cost
	}
	if !peek && !b.Reset && b.EvaluationID == "" {
		b.EvaluationID = newEvaluationID()
	}
	data, err := json.Marshal(b)
	if err != nil {
		return incompatible(sluice.ErrInvalidRequest, err.Error())
	}
	retries := c.retries
	if peek {
		retries = 0 // a peek spends nothing: the caller may simply ask again
	}
	return c.send(ctx, c.endpoint, data, &req, retries)
}

// send posts data to url, retrying up to retries times with exponential
// back-off an answer lost after it was sent (see once), and returns the
// last outcome.
func (c *Client) send(ctx context.Context, url string, data []byte, req *sluice.Request, retries int) sluice.Outcome {
	for attempt := 0; ; attempt++ {
		o, retry := c.once(ctx, url, data, req)
		if !retry || attempt >= retries {
			return o
		}
		wait := time.NewTimer(c.backoff << attempt)
		select {
		case <-ctx.Done():
			wait.Stop()
			return o
		case <-wait.C:
		}
	}
}

// once sends one attempt and reports whether its outcome may be retried
// with the same evaluation ID: an answer lost after the request was sent,
// or an Indeterminate one.
func (c *Client) once(ctx context.Context, endpoint string, data []byte, req *sluice.Request) (sluice.Outcome, bool) {
	if err := ctx.Err(); err != nil {
		return sluice.Outcome{Kind: sluice.Unavailable, Cause: sluice.DeadlinePassed, Err: fmt.Errorf("sluiceclient: nothing sent: %w", err)}, false
	}
	actx, cancel := context.WithTimeout(ctx, c.attempt)
	defer cancel()
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, endpoint, bytes.NewReader(data))
	if err != nil {
		return incompatible(sluice.ErrInvalidRequest, err.Error()), false
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if c.token != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		if notSent(err) {
			return sluice.Outcome{Kind: sluice.Unavailable, Cause: sluice.FailedBeforeSend, Err: fmt.Errorf("sluiceclient: %w: %w", sluice.ErrBeforeSend, err)}, false
		}
		return lost(err), true
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return lost(fmt.Errorf("read answer: %w", err)), true
	}
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil || a.Outcome == "" {
		// Not the check API's answer. A 5xx is a gateway in between that
		// may have lost sluice's answer; anything else means something
		// other than the check API answers at this URL.
		err := fmt.Errorf("%s from %s: not a check API answer", resp.Status, endpoint)
		if resp.StatusCode >= 500 {
			return lost(err), true
		}
		return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("sluiceclient: %w", err)}, false
	}
	return outcome(resp.StatusCode, &a, req)
}

// outcome maps an answer of the check API to the library's Outcome.
func outcome(code int, a *answer, req *sluice.Request) (sluice.Outcome, bool) {
	reason := func(sentinel error) error {
		if a.Reason == "" {
			return fmt.Errorf("sluiceclient: %w", sentinel)
		}
		return fmt.Errorf("sluiceclient: %w: %s", sentinel, a.Reason)
	}
	switch code {
	case http.StatusOK, http.StatusTooManyRequests:
		o := sluice.Outcome{Kind: sluice.Allowed, Status: a.status.toStatus(), Replayed: a.Replayed}
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
			o.Policy = req.Policy
			return o, false
		}
		o.Statuses = make([]sluice.Status, len(a.Statuses))
		for i := range a.Statuses {
			o.Statuses[i] = a.Statuses[i].toStatus()
		}
		// The top-level fields are the most restrictive policy's.
		for _, s := range o.Statuses {
			if s.Allowed == o.Allowed && s.Limit == o.Limit && s.Remaining == o.Remaining && s.ResetAfter == o.ResetAfter && s.RetryAfter == o.RetryAfter {
				o.Policy = s.Policy
				break
			}
		}
		return o, false
	case http.StatusUnauthorized:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: reason(ErrUnauthenticated)}, false
	case http.StatusForbidden:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: reason(ErrForbidden)}, false
	case http.StatusBadRequest:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: reason(sluice.ErrInvalidRequest)}, false
	case http.StatusNotFound:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: reason(sluice.ErrUnknownPolicy)}, false
	}
	switch a.Outcome {
	case "indeterminate":
		return sluice.Outcome{Kind: sluice.Indeterminate, Err: reason(sluice.ErrIndeterminate)}, true
	case "unavailable":
		return sluice.Outcome{Kind: sluice.Unavailable, Cause: causeOf(a.Cause), Err: fmt.Errorf("sluiceclient: server could not decide: %s", a.Reason)}, false
	}
	// 422: the reason carries the library's error text; name its sentinel
	// so errors.Is works as it does on the Limiter's outcomes.
	for _, sentinel := range []error{sluice.ErrCostTooHigh, sluice.ErrNotRefundable, sluice.ErrCorruptState, sluice.ErrInvalidRequest, sluice.ErrUnknownPolicy} {
		if strings.Contains(a.Reason, sentinel.Error()) {
			return sluice.Outcome{Kind: sluice.Incompatible, Err: reason(sentinel)}, false
		}
	}
	return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("sluiceclient: %d: %s", code, a.Reason)}, false
}

// Release gives lease (an Outcome.Lease of Check) back: POST /v1/release.
// It is idempotent: Allowed also when the lease was released already or
// expired. A zero Lease is Allowed without asking. Pass a context that
// outlives the work the lease was for: a release that never arrives
// holds the slot until the lease expires.
func (c *Client) Release(ctx context.Context, lease sluice.Lease) sluice.Outcome {
	if lease.ID == "" {
		return sluice.Outcome{Kind: sluice.Allowed}
	}
	return c.leaseCall(ctx, "/v1/release", lease)
}

// Renew extends lease by its policy's lease_ttl: POST /v1/renew. A lease
// that expired is acquired afresh if a slot is free, else Denied.
func (c *Client) Renew(ctx context.Context, lease sluice.Lease) sluice.Outcome {
	return c.leaseCall(ctx, "/v1/renew", lease)
}

// leaseCall posts lease to path, asking again (it is idempotent) while
// answers are lost.
func (c *Client) leaseCall(ctx context.Context, path string, lease sluice.Lease) sluice.Outcome {
	b := body{Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID}
	if len(b.Policies) == 1 {
		b.Policy, b.Policies = b.Policies[0], nil
	}
	data, err := json.Marshal(b)
	if err != nil {
		return incompatible(sluice.ErrInvalidRequest, err.Error())
	}
	req := sluice.Request{Policy: b.Policy, Policies: b.Policies, Subject: lease.Subject}
	o := c.send(ctx, c.base+path, data, &req, c.retries)
	if o.Kind == sluice.Allowed && path == "/v1/renew" {
		o.Lease = lease
	} else {
		o.Lease = sluice.Lease{}
	}
	return o
}

func (s *status) toStatus() sluice.Status {
	return sluice.Status{
		Policy:      s.Policy,
		Allowed:     s.Allowed,
		Limit:       s.Limit,
		Remaining:   s.Remaining,
		ResetAfter:  time.Duration(s.ResetAfterMS) * time.Millisecond,
		RetryAfter:  time.Duration(s.RetryAfterMS) * time.Millisecond,
		Approximate: s.Approximate,
	}
}

func incompatible(sentinel error, msg string) sluice.Outcome {
	return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("sluiceclient: %w: %s", sentinel, msg)}
}

// lost is the outcome of an answer that did not arrive: the request may
// have been decided.
func lost(err error) sluice.Outcome {
	return sluice.Outcome{Kind: sluice.Indeterminate, Err: fmt.Errorf("sluiceclient: %w: %w", sluice.ErrIndeterminate, err)}
}

// notSent reports whether err happened before the request could reach
// the server: no connection, no name, no TLS session.
func notSent(err error) bool {
	var (
		op   *net.OpError
		dns  *net.DNSError
		cert *tls.CertificateVerificationError
		ua   x509.UnknownAuthorityError
		hn   x509.HostnameError
		rh   tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return true
	case errors.As(err, &dns), errors.As(err, &cert), errors.As(err, &ua), errors.As(err, &hn), errors.As(err, &rh):
		return true
	}
	return false
}

// newEvaluationID returns 128 random bits, in unpadded base64url.
func newEvaluationID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// causeOf returns the Cause the server spelt name, or 0 for none or one
// this client does not know.
func causeOf(name string) sluice.Cause {
	for c := sluice.DeadlinePassed; c <= sluice.CorruptState; c++ {
		if c.String() == name {
			return c
		}
	}
	return 0
}
