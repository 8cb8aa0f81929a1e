package httplimit

import (
	"fmt"

	"github.com/sluicehq/sluice"
)

// PerIP returns the middleware of the common case: every request it wraps
// spends one unit of policy for its client address, and is answered 429
// with Retry-After once the address's budget is spent. It builds the
// Limiter over store itself.
//
// The client address is the socket peer's; behind proxies set
// opts.Subject to subject.ClientIP with a resolver that trusts them:
//
//	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
//	…
//	mw, err := httplimit.PerIP(store, policy, httplimit.Options{Subject: subject.ClientIP(ips)})
//
// Wrap each handler (or route) that needs its own limit in its own PerIP
// middleware with its own policy; handlers wrapped with the same policy
// ID over the same store share one budget per address. opts may set
// everything but Routes and Default, which PerIP decides; use New for
// routes and several policies.
func PerIP(store sluice.Store, policy sluice.Policy, opts Options) (*Middleware, error) {
	switch {
	case opts.Routes != nil:
		return nil, fmt.Errorf("httplimit: PerIP: Options.Routes is set: PerIP limits every request by one policy; use New")
	case opts.Default != nil:
		return nil, fmt.Errorf("httplimit: PerIP: Options.Default is set: PerIP names the policy itself; use New")
	}
	limiter, err := sluice.New(store, []sluice.Policy{policy}, sluice.Options{})
	if err != nil {
		return nil, fmt.Errorf("httplimit: PerIP: %w", err)
	}
	opts.Default = []string{policy.ID}
	return New(limiter, opts)
}
