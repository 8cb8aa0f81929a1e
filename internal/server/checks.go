package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
)

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
	return s.decideCheck(ctx, &in, tok)
}
