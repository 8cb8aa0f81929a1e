// Package sluiceclient is a Go client for the check API of sluice serve
// (POST /v1/check, /v1/checks, /v1/release, /v1/renew), for services that share one
// sluice server instead of embedding the library.
//
// Check takes the library's sluice.Request, every operation of it, and
// returns its sluice.Outcome, so code written against a Limiter reads the
// same against a server:
//
//	o := client.Check(ctx, sluice.Request{Policy: "login", Subject: accountID})
//	o = client.Check(ctx, sluice.Request{Op: sluice.Peek, Policies: []string{"login", "daily"}, Subject: accountID})
//	o = client.Check(ctx, sluice.Request{Op: sluice.Refund, Policy: "login", Subject: accountID, Cost: 2})
//	o = client.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: "login", Subject: accountID})
//
// The difference is the subject: send the raw identity (an account ID, an
// API key); the server pseudonymizes it before it becomes a key. A check
// of a concurrency policy (Spend or Acquire: the server acquires when a
// named policy is a concurrency one) that is allowed holds a lease,
// Outcome.Lease; a Check of a Release or a Renew naming its LeaseID, or
// the shorthands Release and Renew, give it back (POST /v1/release) and
// extend it (POST /v1/renew).
//
// A spend, acquisition or refund whose answer is lost (the connection
// broke after the request was written, a timeout, a gateway error) or
// comes back Indeterminate is sent again with the same evaluation ID, a
// few times: the server answers a repeat with the first decision instead
// of spending twice. Check generates an evaluation ID for each of them
// that has none. A reset, release or renewal is idempotent and simply sent
// again; a peek, which spends nothing, is sent once, and so is a book
// (Reserve), which has no evaluation id to replay it by. With Retries
// negative nothing is sent again, and Check generates no evaluation ID:
// one that is never repeated would only cost the server its memory.
package sluiceclient

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
)

// Defaults of Options.
const (
	defaultRetries        = 2
	defaultAttemptTimeout = 2 * time.Second
	defaultRetryBackoff   = 50 * time.Millisecond
)

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
	// Retries is how many times a request whose answer was lost or
	// Indeterminate is sent again: a spend, acquisition or refund with the
	// same evaluation ID, a reset, release or renewal as it was (they are
	// idempotent), a peek never. Negative: never. Default: 2.
	Retries int
	// AttemptTimeout bounds each attempt, so a hung connection becomes a
	// retry while the context still has time. Default: 2s.
	AttemptTimeout time.Duration
	// RetryBackoff is the pause before the first retry; it doubles for
	// each further one. Default: 50ms.
	RetryBackoff time.Duration
	// NoCoalescing sends every check in a request of its own. Default:
	// false, checks that arrive while another request is on the wire go
	// to the server together, up to 64 in one POST /v1/checks (see
	// Client.Check).
	NoCoalescing bool
}

// Client asks one sluice server. Safe for concurrent use. The
// goroutines that send coalesced checks end by themselves once no check
// waits. Close releases its idle connections.
type Client struct {
	base    string // the server's URL, without /v1/check
	token   string
	http    *http.Client
	own     bool // http is the Client's own
	retries int
	attempt time.Duration
	backoff time.Duration
	co      *coalescer // nil with NoCoalescing
}

// New returns a Client for the server at baseURL, e.g.
// "https://sluice.internal:8080"; a URL that ends in /v1/check is taken
// for the server's.
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
		base:    strings.TrimSuffix(strings.TrimSuffix(u.String(), "/"), checkapi.CheckPath),
		token:   opts.Token,
		http:    opts.HTTPClient,
		retries: opts.Retries,
		attempt: opts.AttemptTimeout,
		backoff: opts.RetryBackoff,
	}
	if !opts.NoCoalescing {
		c.co = &coalescer{}
	}
	if c.http == nil {
		c.http = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		c.own = true
	}
	switch {
	case c.retries == 0:
		c.retries = defaultRetries
	case c.retries < 0:
		c.retries = 0
	}
	if c.attempt == 0 {
		c.attempt = defaultAttemptTimeout
	}
	if c.backoff == 0 {
		c.backoff = defaultRetryBackoff
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

// Check asks the server to take req, any operation, and returns its
// outcome. req.Subject is the raw identity, which the server
// pseudonymizes: 1 to 1024 bytes. Like sluice.Limiter.Check it never
// panics and returns no error: a failure is an Outcome of kind
// Incompatible (the request's fault, or a missing token:
// ErrUnauthenticated, ErrForbidden), Unavailable (nothing was spent: the
// server could not decide, or was not reached) or Indeterminate (the
// answer was lost after every retry: the units may have been spent), with
// Err set, matching the sluice.Err… sentinels and Causes as a Limiter's would; an
// Unavailable answer from the server keeps its Cause.
//
// A check (any operation but a release or a renewal) that finds no other
// request of the Client on the wire is sent at once, as POST /v1/check.
// Checks that arrive while one is are gathered, as a Redis store gathers
// the decisions that find it busy, and sent together, up to 64 in one
// POST /v1/checks: no timer holds a check back, and each gets the outcome
// it would have got alone, retries included. A server without
// /v1/checks (404) is sent single checks from then on. A gathered check
// is sent under the Client's own context, bounded by AttemptTimeout:
// one caller's cancellation never cancels the others'; that caller
// returns at once, Unavailable if its check was not sent yet,
// Indeterminate if it was.
func (c *Client) Check(ctx context.Context, req sluice.Request) sluice.Outcome {
	body, path, err := checkapi.Encode(req)
	if err != nil {
		if bad, ok := errors.AsType[*checkapi.RequestError](err); ok {
			return incompatible(sluice.ErrInvalidRequest, bad.Reason)
		}
		return incompatible(sluice.ErrInvalidRequest, err.Error())
	}
	retries := c.retries
	switch req.Op {
	case sluice.Peek:
		retries = 0 // it spends nothing: the caller may simply ask again
	case sluice.Book:
		retries = 0 // no evaluation id to replay it by: a lost answer may have booked
	case sluice.Spend, sluice.Acquire, sluice.Refund:
		// An id of its own only when it may be sent again: the server
		// remembers every id for the policy's dedupe_ttl.
		if body.EvaluationID == "" && retries > 0 {
			body.EvaluationID = newEvaluationID()
		}
	}
	data, err := json.Marshal(body)
	if err != nil {
		return incompatible(sluice.ErrInvalidRequest, err.Error())
	}
	if c.co != nil && path == checkapi.CheckPath {
		return c.coalesce(ctx, data, &req, retries)
	}
	return c.send(ctx, c.base+path, data, &req, retries, nil)
}

// Reserve books req's cost on the server (op book; req.Op is Spend or
// Book), as sluice.Limiter.Reserve does, and returns at once: the
// outcome, Allowed with Status.Delay the wait until the booked slot
// (the answer's delay_ms: rounded up to the millisecond, never early),
// or Denied when the slot lies past MaxWait (nothing booked), or any
// failure Check answers (a lost answer is not retried: a book carries
// no evaluation id to replay it by, so it is Indeterminate); and cancel,
// which gives the booking back (a refund: the token needs the refund
// scope) while its slot is still ahead, and does nothing after it, for
// an outcome that booked nothing, or when called again. As the
// Limiter's, it is exact while the booking is the latest of its policy
// and subject, approximate when others were booked after it.
func (c *Client) Reserve(ctx context.Context, req sluice.Request) (sluice.Outcome, func()) {
	if req.Op != sluice.Spend && req.Op != sluice.Book {
		return incompatible(sluice.ErrInvalidRequest, fmt.Sprintf("op %v: a reservation books a spend: leave Op unset or Book", req.Op)), func() {}
	}
	req.Op = sluice.Book
	o := c.Check(ctx, req)
	if o.Kind != sluice.Allowed || o.Delay <= 0 {
		return o, func() {}
	}
	slot := time.Now().Add(o.Delay)
	var once sync.Once
	return o, func() {
		once.Do(func() {
			if time.Now().Before(slot) {
				c.Check(context.WithoutCancel(ctx), sluice.Request{Op: sluice.Refund, Policy: req.Policy, Policies: req.Policies, Subject: req.Subject, Cost: req.Cost})
			}
		})
	}
}

// send posts data to url, retrying up to retries times with exponential
// back-off an answer lost after it was sent (see once), and returns the
// last outcome. The first attempt is first when it is not nil: a
// batch's, which held data.
func (c *Client) send(ctx context.Context, url string, data []byte, req *sluice.Request, retries int, first *answered) sluice.Outcome {
	for attempt := 0; ; attempt++ {
		var o sluice.Outcome
		var retry bool
		if attempt == 0 && first != nil {
			o, retry = first.o, first.retry
		} else {
			o, retry = c.once(ctx, url, data, req)
		}
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
	code, raw, err := c.post(actx, endpoint, data, 1<<20)
	if err != nil {
		return unanswered(err)
	}
	a, err := checkapi.ParseAnswer(raw)
	if err != nil {
		// Not the check API's answer. A 5xx is a gateway in between that
		// may have lost sluice's answer; anything else means something
		// other than the check API answers at this URL.
		err := fmt.Errorf("%d %s from %s: not a check API answer", code, http.StatusText(code), endpoint)
		if code >= 500 {
			return lost(err), true
		}
		return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("sluiceclient: %w", err)}, false
	}
	return outcome(code, &a, req)
}

// outcome returns the outcome of req that a, answered with HTTP status
// code, stands for, and whether it may be retried with the same
// evaluation ID (Indeterminate).
func outcome(code int, a *checkapi.Answer, req *sluice.Request) (sluice.Outcome, bool) {
	switch code {
	case http.StatusUnauthorized:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("%w: %s", ErrUnauthenticated, a.Reason)}, false
	case http.StatusForbidden:
		return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("%w: %s", ErrForbidden, a.Reason)}, false
	}
	o := checkapi.Outcome(code, a, req)
	if o.Err != nil {
		o.Err = fmt.Errorf("sluiceclient: %w", o.Err)
	}
	return o, o.Kind == sluice.Indeterminate
}

// unanswered returns the outcome of a request err kept from being
// answered, and whether it may be retried: nothing was sent, or the
// answer was lost.
func unanswered(err error) (sluice.Outcome, bool) {
	if notSent(err) {
		return sluice.Outcome{Kind: sluice.Unavailable, Cause: sluice.FailedBeforeSend, Err: fmt.Errorf("sluiceclient: %w: %w", sluice.FailedBeforeSend, err)}, false
	}
	return lost(err), true
}

// Release gives lease (an Outcome.Lease of Check) back: a Check of a
// Release, as a Limiter takes one (sluice.Release). It is idempotent: Allowed also when
// the lease was released already or expired. A zero Lease is Allowed
// without asking. Pass a context that outlives the work the lease was
// for: a release that never arrives holds the slot until the lease
// expires.
func (c *Client) Release(ctx context.Context, lease sluice.Lease) sluice.Outcome {
	if lease.ID == "" {
		return sluice.Outcome{Kind: sluice.Allowed}
	}
	return c.Check(ctx, sluice.Request{Op: sluice.Release, Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID})
}

// Renew extends lease by its policy's lease_ttl: a Check of a Renew, as
// sluice.Limiter.Renew. A lease that expired is acquired afresh if a slot
// is free, else Denied.
func (c *Client) Renew(ctx context.Context, lease sluice.Lease) sluice.Outcome {
	return c.Check(ctx, sluice.Request{Op: sluice.Renew, Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID})
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
