package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/config"
)

// decided is one check of the check API decided: the answer POST
// /v1/check gives it, which POST /v1/checks lists as one result.
type decided struct {
	req    sluice.Request // the operation, its subject pseudonymized; zero when refused before the Limiter
	o      sluice.Outcome
	code   int    // the answer's HTTP status
	reason string // the answer's reason
	scope  string // with code 403: the scope the token lacks
}

// decideCheck decides in, one check of the check API (the body of POST
// /v1/check, one entry of POST /v1/checks), for tok, the request's
// token (nil when the server has no tokens): a malformed check is a 400,
// one whose operation needs a scope tok lacks a 403, and any other is
// decided by the edge core, its subject pseudonymized, a spend naming a
// concurrency policy acquiring. It writes nothing: the caller answers,
// one check or a list of them. Every check the server answers, whatever
// the endpoint, is decided here.
func (s *Server) decideCheck(ctx context.Context, tok *authToken, in *checkapi.Request) decided {
	req, err := in.Check()
	if err != nil {
		why := err.Error()
		if bad, ok := errors.AsType[*checkapi.RequestError](err); ok {
			why = bad.Reason
		}
		return decided{o: sluice.Outcome{Kind: sluice.Incompatible}, code: http.StatusBadRequest, reason: why}
	}
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
		return decided{o: sluice.Outcome{Kind: sluice.Incompatible}, code: http.StatusForbidden, reason: lacksScope(tok, scope), scope: scope}
	}
	raw := req.Subject
	req.Subject, req.Previous = s.pseud.Pseudonym("api", raw, ""), s.pseud.Previous("api", raw, "")
	// The core counts a spend (or acquire) once, on the metrics.
	o := s.core.Check(ctx, req)
	return decided{req: req, o: o, code: checkapi.StatusCode(&o), reason: reason(&o)}
}

// log records d, the check in, on the request log's line.
func (d *decided) log(lw *logWriter, in *checkapi.Request) {
	switch d.code {
	case http.StatusBadRequest:
		if d.req.Subject == "" {
			lw.reason = d.reason
			return
		}
	case http.StatusForbidden:
		if d.req.Subject == "" {
			lw.reason = "token lacks scope " + d.scope
			return
		}
	}
	lw.hasCheck = true
	lw.policy = in.Policy
	if len(in.Policies) > 0 {
		lw.policy = strings.Join(in.Policies, ",")
	}
	lw.pseudo, lw.cost, lw.outcome, lw.reason = d.req.Subject, d.req.Cost, d.o.Kind.String(), d.reason
	lw.refund, lw.replayed = d.req.Op == sluice.Refund, d.o.Replayed
}

// batchBodyFactor is how many times a check's body bound (MaxBodyBytes,
// 64 KiB by default) the body of POST /v1/checks may be: 256 KiB by
// default, 4 KiB a check on average when it holds MaxChecks, room for
// 64 checks of the longest subject (1 KiB) and a few policies each.
const batchBodyFactor = 4

// checks answers POST /v1/checks: each check decided by decideCheck, all
// of them at once, so that a store that shares round trips between
// concurrent decisions (redisstore) sends them together; answered 200
// with one result per check, in order.
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
	results := make([]decided, len(in.Checks))
	var wg sync.WaitGroup
	for i := 1; i < len(in.Checks); i++ {
		wg.Go(func() { results[i] = s.decideEntry(r.Context(), tok, in.Checks[i]) })
	}
	results[0] = s.decideEntry(r.Context(), tok, in.Checks[0])
	wg.Wait()
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

// decideEntry decides raw, one entry of a batch: a 400 when it is not a
// check's body, else decideCheck's answer.
func (s *Server) decideEntry(ctx context.Context, tok *authToken, raw json.RawMessage) decided {
	var in checkapi.Request
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		why := "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")
		return decided{o: sluice.Outcome{Kind: sluice.Incompatible}, code: http.StatusBadRequest, reason: why}
	}
	return s.decideCheck(ctx, tok, &in)
}
