package sluice

import (
	"context"
	"fmt"
)

// Meter runs work whose cost is known only once it is done (the tokens an
// LLM call used, the rows a query returned): it spends req.Cost as an
// Estimate, runs work when that is Allowed, and settles the estimate with
// the cost work returns (Settle), also when work panics (then at the
// estimate: nothing given back) or its context is cancelled. req.Op is
// Spend or Estimate; an EvaluationID is made when req has none.
//
// The Outcome is the estimate's when it was not Allowed (work did not
// run; err is nil), else the settle's: Allowed, with Charged, GivenBack
// and Owed (Unavailable or Indeterminate when the settle could not be
// taken: the estimate then stays spent, as the store keeps an unsettled
// estimate spent). err is work's error.
//
//	o, err := lim.Meter(ctx, sluice.Request{Policy: "tokens", Subject: user, Cost: 500},
//		func(ctx context.Context) (int64, error) {
//			resp, err := callModel(ctx, prompt)
//			return int64(resp.Usage.TotalTokens), err
//		})
func (l *Limiter) Meter(ctx context.Context, req Request, work func(ctx context.Context) (int64, error)) (o Outcome, err error) {
	if req.Op != Spend && req.Op != Estimate {
		return Outcome{Kind: Incompatible, Err: fmt.Errorf("sluice: %w: meter takes a spend or an estimate, not %v", ErrInvalidRequest, req.Op)}, nil
	}
	req.Op = Estimate
	if req.EvaluationID == "" {
		req.EvaluationID = newID()
	}
	if o = l.Check(ctx, req); o.Kind != Allowed {
		return o, nil
	}
	used := max(req.Cost, 1) // a cost of 0 is 1, as Check reads it
	defer func() {
		r := recover()
		req.Op, req.Cost = Settle, used
		o = l.Check(context.WithoutCancel(ctx), req)
		if r != nil {
			panic(r)
		}
	}()
	used, err = work(ctx)
	return o, err
}
