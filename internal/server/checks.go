package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
)

// batchBodyFactor is how many times a check's body bound (MaxBodyBytes,
// 64 KiB by default) the body of POST /v1/checks may be: 256 KiB by
// default, 4 KiB a check on average when it holds MaxChecks, room for
// 64 checks of the longest subject (1 KiB) and a few policies each.
const batchBodyFactor = 4

// checks answers POST /v1/checks: the checks decided by decideAll,
// answered 200 with one result per check, in order.
func (s *Server) checks(w http.ResponseWriter, r *http.Request) {
	var none checkapi.Request
	tok, ok := s.authenticated(w, r, &none)
	if !ok {
		return
	}
	var in checkapi.Batch
	code, why := decodeBodyCode(w, r, s.maxBody*batchBodyFactor, &in)
	switch {
	case why != "":
	case len(in.Checks) == 0:
		code, why = http.StatusBadRequest, "checks is empty: want 1 to 64 checks"
	case len(in.Checks) > checkapi.MaxChecks:
		code, why = http.StatusRequestEntityTooLarge, fmt.Sprintf("checks holds %d checks: must be at most %d", len(in.Checks), checkapi.MaxChecks)
	}
	if why != "" {
		if lw, ok := w.(*logWriter); ok {
			lw.reason = why
		}
		s.answer(w, &none, code, sluice.Outcome{Kind: sluice.Incompatible}, why)
		return
	}
	results := s.decideAll(r.Context(), tok, in.Checks)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	b := append((*bp)[:0], `{"results":[`...)
	for i := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = checkapi.AppendResult(b, results[i].code, &results[i].o, results[i].reason)
	}
	b = append(b, "]}\n"...)
	*bp = b
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	h["Date"] = date()
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// decideAll decides the checks of a batch, each entry as decideCheck
// decides it alone (a 400 for one that is not a check's body). Every entry
// is decoded first, here, in order. On a store that shares round trips
// between concurrent decisions (StoreInfo.Batches: redisstore) the checks
// are then decided at once, a goroutine each, so that they reach it
// together; on one that decides in process (memstore) one after another
// on this goroutine, in order: there a goroutine a check only added its
// start and the growth of its fresh stack (a fifth of a batch's server
// CPU, most of it encoding/json's and the Limiter's frames).
func (s *Server) decideAll(ctx context.Context, tok *authToken, checks []json.RawMessage) []decided {
	results := make([]decided, len(checks))
	ins := make([]checkapi.Request, len(checks))
	// One decoder reads the entries as a stream of values: each is one
	// JSON value (the body's decoding checked its syntax), so an entry
	// that is not a check's body (an unknown field, a wrong type) leaves
	// the decoder at the next, and its buffer and scanner serve them all.
	n := 0
	for _, raw := range checks {
		n += len(raw) + 1
	}
	stream := make([]byte, 0, n)
	for _, raw := range checks {
		stream = append(append(stream, raw...), ' ')
	}
	dec := json.NewDecoder(bytes.NewReader(stream))
	dec.DisallowUnknownFields()
	for i := range checks {
		if err := dec.Decode(&ins[i]); err != nil {
			why := "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")
			results[i] = decided{o: sluice.Outcome{Kind: sluice.Incompatible}, code: http.StatusBadRequest, reason: why}
		}
	}
	var wg sync.WaitGroup
	for i := range checks {
		switch {
		case results[i].code != 0: // malformed
		case s.store.Batches && i < len(checks)-1:
			wg.Go(func() { results[i] = s.decideCheck(ctx, &ins[i], tok) })
		default:
			results[i] = s.decideCheck(ctx, &ins[i], tok)
		}
	}
	wg.Wait()
	return results
}

func (s *Server) check(w http.ResponseWriter, r *http.Request) {
	lw, _ := w.(*logWriter)
	var in checkapi.Request
	tok, ok := s.authenticated(w, r, &in)
	if !ok {
		return
	}
	if why := s.decode(w, r, &in); why != "" {
		s.badRequest(w, &in, why)
		return
	}
	d := s.decideCheck(r.Context(), &in, tok)
	switch {
	case d.code == http.StatusBadRequest && !d.decided:
		s.badRequest(w, &in, d.reason)
		return
	case d.code == http.StatusForbidden:
		if lw != nil {
			lw.reason = "token lacks scope " + d.scope
		}
		s.refuse(w, &in, tok, d.scope)
		return
	}
	if lw != nil {
		d.record(lw, &in)
	}
	s.answer(w, &in, d.code, d.o, d.reason)
}

// decided is a check decideCheck answered: what it asked for (its
// subject pseudonymized), the outcome, the HTTP status of its answer and
// the answer's reason.
type decided struct {
	req     sluice.Request
	o       sluice.Outcome
	code    int
	reason  string
	scope   string // the scope the check needs (a 403's, the token lacks)
	decided bool   // the edge core decided: false for a 400 or 403 before it
}

// decideCheck decides in, the body of a check, presented with tok (nil
// when no tokens are configured): 400 when in is malformed, 403 when tok
// lacks the scope its operation needs, else the edge core's decision,
// counted once on the metrics. POST /v1/check, each entry of POST
// /v1/checks (checks.go) and the gRPC check service (grpccheck.go) answer
// what it returns; each authenticates its own way. It writes nothing.
func (s *Server) decideCheck(ctx context.Context, in *checkapi.Request, tok *authToken) decided {
	req, err := in.Check()
	if err != nil {
		return decided{o: sluice.Outcome{Kind: sluice.Incompatible}, code: http.StatusBadRequest, reason: requestReason(err)}
	}
	s.pseudonymize(&req)
	scope := config.ScopeCheck
	switch req.Op {
	case sluice.Refund:
		scope = config.ScopeRefund
	case sluice.Reset:
		scope = config.ScopeReset
	case sluice.Spend:
		if s.namesConcurrency(&req) {
			req.Op = sluice.Acquire
		}
	}
	if tok != nil && !slices.Contains(tok.scopes, scope) {
		return decided{req: req, o: sluice.Outcome{Kind: sluice.Incompatible}, code: http.StatusForbidden, scope: scope, reason: lacksScope(tok, scope)}
	}
	o := s.core.Check(ctx, req)
	return decided{req: req, o: o, code: checkapi.StatusCode(&o), reason: reason(&o), scope: scope, decided: true}
}

// record fills in the request log's decision fields of d, asked by in.
func (d *decided) record(lw *logWriter, in *checkapi.Request) {
	lw.hasCheck = true
	lw.policy = in.Policy
	if len(in.Policies) > 0 {
		lw.policy = strings.Join(in.Policies, ",")
	}
	lw.pseudo, lw.cost, lw.outcome, lw.reason = d.req.Subject, d.req.Cost, d.o.Kind.String(), d.reason
	lw.refund, lw.replayed = d.req.Op == sluice.Refund, d.o.Replayed
}

// namesConcurrency reports whether req names a concurrency policy: a
// check of one acquires a lease.
func (s *Server) namesConcurrency(req *sluice.Request) bool {
	for _, id := range append([]string{req.Policy}, req.Policies...) {
		if p, _ := s.policy(id); p.Algorithm == sluice.Concurrency {
			return true
		}
	}
	return false
}

// lease returns the handler of op, a Release (POST /v1/release) or a Renew
// (POST /v1/renew).
func (s *Server) lease(op sluice.Op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { s.leaseOp(w, r, op) }
}

// leaseOp answers a release or renewal.
func (s *Server) leaseOp(w http.ResponseWriter, r *http.Request, op sluice.Op) {
	lw, _ := w.(*logWriter)
	var in checkapi.Request
	if tok, ok := s.authenticated(w, r, &in); !ok || !s.permits(w, &in, tok, config.ScopeCheck) {
		return
	}
	req, ok := s.read(w, r, &in, func() (sluice.Request, error) { return in.Lease(op) })
	if !ok {
		return
	}
	// The lease is released from the concurrency policies named: a client
	// may name every policy of the check that acquired it.
	var ids []string
	for _, id := range append([]string{req.Policy}, req.Policies...) {
		if p, known := s.policy(id); id != "" && (!known || p.Algorithm == sluice.Concurrency) {
			ids = append(ids, id) // an unknown one is the Limiter's 404
		}
	}
	if len(ids) == 0 {
		s.badRequest(w, &in, "names no concurrency policy: only those hold leases")
		return
	}
	if len(in.Policies) > 0 {
		in.Policies = ids // the answer's statuses and RateLimit-Policy
	}
	// Previous stays unset, as before and as in a Limiter's Release: a lease
	// acquired under an older key is not looked for there (it expires
	// after its lease_ttl).
	req.Policy, req.Policies, req.Previous = "", ids, nil
	o := s.core.Check(r.Context(), req)
	if len(in.Policies) == 0 {
		o.Statuses = nil // one policy: its status is the top level, as for a check
	}
	if lw != nil {
		lw.hasCheck = true
		lw.policy = strings.Join(ids, ",")
		lw.pseudo, lw.outcome, lw.reason = req.Subject, o.Kind.String(), reason(&o)
	}
	s.answer(w, &in, checkapi.StatusCode(&o), o, reason(&o))
}

// badRequest answers 400 with why, without asking the Limiter.
func (s *Server) badRequest(w http.ResponseWriter, in *checkapi.Request, why string) {
	if lw, ok := w.(*logWriter); ok {
		lw.reason = why
	}
	s.answer(w, in, http.StatusBadRequest, sluice.Outcome{Kind: sluice.Incompatible}, why)
}

// read decodes the body into in and parse reads the operation it asks for
// (in.Check, in.Lease), its subject pseudonymized. A malformed request is
// answered 400 here, and read reports false.
func (s *Server) read(w http.ResponseWriter, r *http.Request, in *checkapi.Request, parse func() (sluice.Request, error)) (sluice.Request, bool) {
	var req sluice.Request
	why := s.decode(w, r, in)
	if why == "" {
		var err error
		if req, err = parse(); err != nil {
			why = requestReason(err)
		}
	}
	if why != "" {
		s.badRequest(w, in, why)
		return req, false
	}
	s.pseudonymize(&req)
	return req, true
}

// requestReason is the 400's reason for err, a request checkapi refuses.
func requestReason(err error) string {
	if bad, ok := errors.AsType[*checkapi.RequestError](err); ok {
		return bad.Reason
	}
	return err.Error()
}

// pseudonymize replaces req's raw subject with its pseudonym (and the
// older keys' in Previous).
func (s *Server) pseudonymize(req *sluice.Request) {
	raw := req.Subject
	req.Subject, req.Previous = s.pseud.Pseudonym("api", raw, ""), s.pseud.Previous("api", raw, "")
}

// decode reads the body into in: the reason it is not one JSON object of
// in's type (the check API's, the admin API's), or "".
func (s *Server) decode(w http.ResponseWriter, r *http.Request, in any) string {
	return decodeBody(w, r, s.maxBody, in)
}

// decodeBody is decode with the body's bound given: the playground's
// is its own (playgroundMaxBody), not the check API's.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, in any) string {
	_, why := decodeBodyCode(w, r, limit, in)
	return why
}

// decodeBodyCode is decodeBody with the status its reason is answered
// with: 413 for a body over limit, else 400.
func decodeBodyCode(w http.ResponseWriter, r *http.Request, limit int64, in any) (int, string) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(in)
	if err == nil {
		if _, err = dec.Token(); errors.Is(err, io.EOF) {
			return http.StatusOK, ""
		}
		if _, tooLarge := errors.AsType[*http.MaxBytesError](err); !tooLarge {
			return http.StatusBadRequest, "malformed JSON: more than one value in the body"
		}
	}
	if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", tooLarge.Limit)
	}
	if errors.Is(err, io.EOF) {
		return http.StatusBadRequest, "request body is empty: want a JSON object"
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		// A network error names both ends' addresses: never in an answer
		// or a log line.
		return http.StatusBadRequest, "request body could not be read: the connection failed or timed out"
	}
	return http.StatusBadRequest, "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// answer writes the JSON answer and its header fields.
func (s *Server) answer(w http.ResponseWriter, in *checkapi.Request, code int, o sluice.Outcome, reason string) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	h["Date"] = date()
	if code == http.StatusOK || code == http.StatusTooManyRequests {
		b := (*bp)[:0]
		if len(o.Statuses) > 0 {
			for i, id := range in.Policies {
				if i > 0 {
					b = append(b, ", "...)
				}
				b = append(b, s.policyField[id]...)
			}
			h["Ratelimit-Policy"] = []string{string(b)}
		} else {
			h["Ratelimit-Policy"] = []string{s.policyField[o.Policy]}
		}
		b = ratelimitheader.AppendLimitField(b[:0], o)
		h["Ratelimit"] = []string{string(b)}
		*bp = b
	}
	switch code {
	case http.StatusTooManyRequests:
		h["Retry-After"] = []string{strconv.FormatInt(ratelimitheader.RetryAfterSeconds(o.RetryAfter), 10)}
	case http.StatusServiceUnavailable:
		h["Retry-After"] = []string{"1"}
	}
	b := checkapi.AppendAnswer((*bp)[:0], &o, reason)
	*bp = b
	w.WriteHeader(code)
	w.Write(b)
}

var (
	jsonContentType = []string{"application/json"}
	noStore         = []string{"no-store"}
)

// reason is the answer's "reason": why no decision was taken, "" for a
// decision; in the library's words (the Limiter says a store's error so),
// without the library's own package name, which a client of the check
// API has no use for.
func reason(o *sluice.Outcome) string {
	if o.Err == nil {
		return ""
	}
	return strings.TrimPrefix(o.Err.Error(), "sluice: ")
}
