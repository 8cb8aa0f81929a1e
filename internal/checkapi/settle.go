package checkapi

import (
	"time"

	"github.com/sluicehq/sluice"
)

// settle returns what r, naming an op, asks for: req, an Estimate of r's
// cost (absent: 1) or a Settle with r's actual cost (required, 0
// included), each under r's evaluation_id (required: the settle finds
// its estimate by it). A malformed r is a *RequestError.
func (r *Request) settle(req sluice.Request) (sluice.Request, error) {
	switch {
	case r.Op != sluice.Estimate.String() && r.Op != sluice.Settle.String():
		return sluice.Request{}, malformed("op = %q: must be estimate, settle or book (refund and reset are fields of their own)", r.Op)
	case r.Refund || r.Reset:
		return sluice.Request{}, malformed("op = %q with refund or reset: one operation at a time", r.Op)
	case r.EvaluationID == "":
		return sluice.Request{}, malformed("op = %q: evaluation_id is required: the settle finds its estimate by it", r.Op)
	case r.Op == sluice.Estimate.String() && r.Cost != nil && *r.Cost == 0:
		return sluice.Request{}, malformed("cost = 0 with op estimate: an estimate spends 1 or more")
	case r.Op == sluice.Settle.String() && r.Cost == nil:
		return sluice.Request{}, malformed("op = settle: cost is required: the actual cost, 0 included")
	}
	req.Op = sluice.Estimate
	if r.Op == sluice.Settle.String() {
		req.Op = sluice.Settle
	}
	if r.Cost != nil {
		req.Cost = *r.Cost
	}
	return req, nil
}

// book returns what r, op book, asks for: req, a Book of r's cost
// (absent: 1) waiting up to r's max_wait_ms (absent: the policy's). A
// malformed r is a *RequestError.
func (r *Request) book(req sluice.Request) (sluice.Request, error) {
	switch {
	case r.Refund || r.Reset:
		return sluice.Request{}, malformed("op = book with refund or reset: one operation at a time")
	case r.EvaluationID != "":
		return sluice.Request{}, malformed("op = book with evaluation_id: a book takes none: a replay would answer a slot already passed")
	case r.Cost != nil && *r.Cost == 0:
		return sluice.Request{}, malformed("cost = 0 with op book: a book spends 1 or more")
	case r.MaxWaitMS != nil && (*r.MaxWaitMS < 1 || *r.MaxWaitMS > maxWaitMS):
		return sluice.Request{}, malformed("max_wait_ms = %d: must be 1 to %d (24h); leave it out for the policy's max_wait", *r.MaxWaitMS, maxWaitMS)
	}
	req.Op = sluice.Book
	if r.Cost != nil {
		req.Cost = *r.Cost
	}
	if r.MaxWaitMS != nil {
		req.MaxWait = time.Duration(*r.MaxWaitMS) * time.Millisecond
	}
	return req, nil
}

// maxWaitMS is the longest max_wait_ms, 24h: the engine's bound.
const maxWaitMS = 86_400_000
