package httplimit

import (
	"fmt"

	"github.com/sluicehq/sluice"
)

// PerIP returns the middleware of the common case: every request it wraps
// spends one unit of policy for its client address, resolved through
// opts.TrustedProxies, and is answered 429 with Retry-After once the
// address's budget is spent. It builds the Limiter over store itself.
//
// Wrap each handler (or route) that needs its own limit in its own PerIP
// middleware with its own policy; handlers wrapped with the same policy
// ID over the same store share one budget per address. opts may set
// everything but Routes, Default, Sources, Principal and APIKeyHeader,
// which PerIP decides; use NewMiddleware for routes, several policies or
// other subjects, and for a policy whose FailureMode is FailLocal (its
// local fallback is built from the Limiter; see LocalFallback).
func PerIP(store sluice.Store, policy sluice.Policy, opts Options) (*Middleware, error) {
	if policy.FailureMode == sluice.FailLocal {
		return nil, fmt.Errorf("httplimit: PerIP: policy %q: failure mode local needs a fallback limiter built from the Limiter; use NewMiddleware with LocalFallback", policy.ID)
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"Routes", opts.Routes != nil},
		{"Default", opts.Default != nil},
		{"Sources", opts.Sources != nil},
		{"Principal", opts.Principal != nil},
		{"APIKeyHeader", opts.APIKeyHeader != ""},
	} {
		if f.set {
			return nil, fmt.Errorf("httplimit: PerIP: Options.%s is set: PerIP limits by client address alone; use NewMiddleware", f.name)
		}
	}
	limiter, err := sluice.New(store, []sluice.Policy{policy}, sluice.Options{})
	if err != nil {
		return nil, fmt.Errorf("httplimit: PerIP: %w", err)
	}
	opts.Default = []string{policy.ID}
	opts.Sources = []Source{FromIP}
	return NewMiddleware(limiter, opts)
}
