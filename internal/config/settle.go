package config

import (
	"fmt"
	"strconv"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
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

// validateQueue reports every rule a proxy route at path breaks with its
// max_delay and queue_limit: a whole number of ms from 1ms to 24h, at
// most the policy's max_wait (which bounds every booking); queue_limit 1 or more, only beside
// a max_delay; one policy, of gcra or token_bucket (the algorithms with a
// future slot to book); not with shadow or settle_header.
func (c *Config) validateQueue(path string, r Route) []*Error {
	d := r.MaxDelay
	switch {
	case d == 0 && r.QueueLimit != 0:
		return []*Error{c.errorAt(path+".queue_limit", strconv.FormatInt(r.QueueLimit, 10), "applies only with max_delay: how many requests are held at once")}
	case d == 0:
		return nil
	case d < time.Millisecond || d > 24*time.Hour || d%time.Millisecond != 0:
		return []*Error{c.errorAt(path+".max_delay", d.String(), "must be a whole number of milliseconds from 1ms to 24h")}
	case r.QueueLimit < 0:
		return []*Error{c.errorAt(path+".queue_limit", strconv.FormatInt(r.QueueLimit, 10), "must be 1 or more (absent: 1000)")}
	case r.Shadow || r.SettleHeader != "":
		return []*Error{c.errorAt(path+".max_delay", d.String(), "a held request books a plain slot: not with shadow or settle_header")}
	case len(r.Policies) != 1:
		return []*Error{c.errorAt(path+".max_delay", d.String(), fmt.Sprintf("a queue books a slot of one policy, not of %d", len(r.Policies)))}
	}
	for _, p := range c.Policies {
		if p.ID != r.Policies[0] {
			continue
		}
		if p.Algorithm != sluice.GCRA && p.Algorithm != sluice.TokenBucket {
			return []*Error{c.errorAt(path+".max_delay", d.String(), fmt.Sprintf("policy %q is %v: only gcra and token_bucket have a future slot to book; a denial's Retry-After is its answer", p.ID, p.Algorithm))}
		}
		probe := p.Policy
		probe.MaxWait = d
		if err := probe.Validate(); err != nil && p.Policy.Validate() == nil {
			return []*Error{c.errorAt(path+".max_delay", d.String(), fmt.Sprintf("cannot book on policy %q: %v", p.ID, err))}
		}
		if most := evaluation.Defaults(p.Policy).MaxWait; p.Policy.Validate() == nil && d > most {
			return []*Error{c.errorAt(path+".max_delay", d.String(), fmt.Sprintf("is more than policy %q's max_wait (%v), which bounds every booking: raise its max_wait", p.ID, most))}
		}
	}
	return nil
}
