package config

import (
	"fmt"
	"strconv"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/evaluation"
)

// validateSettle reports every rule a proxy route at path breaks with its
// settle_header and estimate: a header field name; an estimate of 1 or
// more, only beside a settle_header, at most each policy's max_cost; and
// policies whose algorithm takes estimates (fixed_window, sliding_log,
// token_bucket, gcra: sliding_window cannot give back exactly,
// concurrency counts leases, not units).
func (c *Config) validateSettle(path string, r Route) []*Error {
	var errs []*Error
	switch {
	case r.SettleHeader == "" && r.Estimate != 0:
		return append(errs, c.errorAt(path+".estimate", strconv.FormatInt(r.Estimate, 10), "applies only with settle_header: what a request spends before its upstream reports its cost"))
	case r.SettleHeader == "":
		return nil
	case !httpguts.ValidHeaderFieldName(r.SettleHeader):
		errs = append(errs, c.errorAt(path+".settle_header", strconv.Quote(r.SettleHeader), "must be a header field name such as X-Tokens-Used"))
	case r.Estimate < 0:
		errs = append(errs, c.errorAt(path+".estimate", strconv.FormatInt(r.Estimate, 10), "must be 1 or more (absent: 1)"))
	}
	for j, id := range r.Policies {
		for _, p := range c.Policies {
			switch {
			case p.ID != id:
			case p.Algorithm == sluice.SlidingWindow || p.Algorithm == sluice.Concurrency:
				errs = append(errs, c.errorAt(fmt.Sprintf("%s.policies[%d]", path, j), strconv.Quote(id), fmt.Sprintf("is a %v policy: a route with settle_header spends estimates, which only fixed_window, sliding_log, token_bucket and gcra can settle", p.Algorithm)))
			case max(r.Estimate, 1) > evaluation.Defaults(p.Policy).MaxCost:
				errs = append(errs, c.errorAt(path+".estimate", strconv.FormatInt(r.Estimate, 10), fmt.Sprintf("must be at most the max_cost of policy %q, %d", id, evaluation.Defaults(p.Policy).MaxCost)))
			default:
				if err := evaluation.CheckEstimate(p.Policy, max(r.Estimate, 1)); err != nil && p.Policy.Validate() == nil {
					errs = append(errs, c.errorAt(fmt.Sprintf("%s.policies[%d]", path, j), strconv.Quote(id), fmt.Sprintf("cannot settle on it: %v", err)))
				}
			}
		}
	}
	return errs
}
