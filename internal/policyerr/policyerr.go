// Package policyerr holds the errors of a policy that breaks a rule and
// of a request naming a policy a Limiter does not have: what config
// loading maps to a line of its file, and what the check API and the
// admin API answer 404 for, matched with errors.As and errors.Is. They
// left the root package (sluice.PolicyError, sluice.ErrUnknownPolicy):
// users read the message and the Outcome's Kind (Incompatible), and the
// module's own packages match them here.
package policyerr

import (
	"errors"
	"fmt"
	"strings"
)

// Error says which field of which policy broke which rule, e.g.
// `sluice: policy "api": limit = 0: must be between 1 and 1000000000`.
type Error struct {
	Policy string // the policy ID, possibly empty
	Field  string // the config spelling: "limit", "window", "burst", …
	Value  string // the offending value as written
	Rule   string // what the value must be
}

func (e *Error) Error() string {
	return fmt.Sprintf("sluice: policy %q: %s = %s: %s", e.Policy, e.Field, e.Value, e.Rule)
}

// ErrUnknownPolicy is wrapped by the error of a request or an override
// naming a policy the Limiter does not have (an Incompatible Outcome).
var ErrUnknownPolicy = errors.New("unknown policy")

// Prefixed wraps Err behind Prefix without repeating the "sluice: "
// that Err's own message starts with, e.g.
// `sluice: New: policies[0]: policy "x": limit = 0: …`.
type Prefixed struct {
	Prefix string
	Err    error
}

func (e *Prefixed) Error() string { return e.Prefix + strings.TrimPrefix(e.Err.Error(), "sluice: ") }

func (e *Prefixed) Unwrap() error { return e.Err }
