package edge

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
)

// Rule is what an edge asks for one request: compiled by Core.Rule, then
// immutable.
type Rule struct {
	// Policies are the IDs spent, all or nothing.
	Policies []string
	// Cost is the units one request spends.
	Cost int64
	// Op is Spend, or Acquire when a policy is a concurrency one.
	Op sluice.Op
	// Mode answers what the store could not decide.
	Mode failure.Mode
	// Field is the RateLimit-Policy field of Policies, e.g.
	// `"login";q=5;w=60`.
	Field string
	// Lease is the ID of a concurrency policy among Policies, or "".
	Lease string
	// MaxDelay is how long a request that does not fit now may be held
	// for a booked slot (Core.Queue); 0: none, it is refused at once.
	MaxDelay time.Duration

	queue *queue // nil without a MaxDelay
}

// Rule checks policies, cost and mode against the Limiter (and the local
// fallback for mode FailLocal) and returns the rule; at names the rule in
// errors, e.g. "Routes[2]". A cost of 0 is 1.
func (c *Core) Rule(at string, policies []string, cost int64, mode failure.Mode) (*Rule, error) {
	r := &Rule{Cost: cmp.Or(cost, 1), Mode: mode}
	switch {
	case cost < 0:
		return nil, c.OptionError(at+".Cost", cost, "must not be negative; leave it 0 for 1")
	case len(policies) == 0:
		return nil, c.OptionError(at+".Policies", "[]", "at least one policy ID is required")
	case mode > failure.Local:
		return nil, c.OptionError(at+".FailureMode", mode, "must be one of closed, open, local")
	case mode == failure.Local && c.fallback == nil:
		return nil, c.OptionError(at+".FailureMode", mode, "is local, but Options.Fallback is nil")
	}
	var field []byte
	for j, id := range policies {
		pat := fmt.Sprintf("%s.Policies[%d]", at, j)
		p, ok := c.policy(id)
		switch {
		case !ok:
			return nil, c.OptionError(pat, fmt.Sprintf("%q", id), "the limiter has no such policy; it has "+strings.Join(c.policies(), ", "))
		case contains(r.Policies, id):
			return nil, c.OptionError(pat, fmt.Sprintf("%q", id), "is named twice")
		case p.Algorithm == sluice.Concurrency: // a lease is one slot whatever the cost
			r.Op, r.Lease = sluice.Acquire, id
		case r.Cost > p.MaxCost:
			return nil, c.OptionError(at+".Cost", r.Cost, fmt.Sprintf("must be at most the max cost of policy %q, %d", id, p.MaxCost))
		}
		if mode == failure.Local && p.Algorithm != sluice.Concurrency {
			if lp, _ := c.fallback.Policy(id); r.Cost > lp.MaxCost {
				return nil, c.OptionError(at+".Cost", r.Cost, fmt.Sprintf("must be at most the max cost of policy %q in the local fallback (its LocalShare), %d", id, lp.MaxCost))
			}
		}
		r.Policies = append(r.Policies, id)
		if j > 0 {
			field = append(field, ", "...)
		}
		field = appendPolicyItem(field, p)
	}
	r.Field = string(field)
	return r, nil
}

// Classes returns the priority classes a request of r may name: those
// r's policies declare (sluice.Policy.Priorities), and "default".
func (c *Core) Classes(r *Rule) []string {
	out := []string{"default"}
	for _, id := range r.Policies {
		p, _ := c.policy(id)
		for class := range p.Priorities {
			if !contains(out, class) {
				out = append(out, class)
			}
		}
	}
	return out
}

// Class checks class, a rule's fixed priority class found at at, against
// r's policies: "" or a class one of them declares (Classes).
func (c *Core) Class(at string, r *Rule, class string) error {
	if known := c.Classes(r); class != "" && !contains(known, class) {
		return c.OptionError(at, fmt.Sprintf("%q", class), "must be a priority class one of the policies declares: "+strings.Join(known, ", "))
	}
	return nil
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// policy returns the Limiter's policy id.
func (c *Core) policy(id string) (sluice.Policy, bool) {
	if c.lim == nil {
		return sluice.Policy{}, false
	}
	return c.lim.Policy(id)
}

func (c *Core) policies() []string {
	if c.lim == nil {
		return nil
	}
	return c.lim.Policies()
}
