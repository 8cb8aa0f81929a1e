// Package sluice is a rate limiter for Go services: it decides, atomically,
// whether a subject may spend cost units of a policy now.
//
// A Limiter validates each Request (policy, subject, cost, deadline) and
// hands one Evaluation to a Store, which decides in one atomic step: the
// embedded memstore in the process, or redisstore in Redis with one Lua
// script call, so many application instances share one limit. The answer is
// a typed Outcome: Allowed, Denied, Incompatible, Unavailable (with a
// Cause) or Indeterminate, never a guess.
//
// # Algorithms
//
// Every algorithm is an integer state machine in internal/algorithm; the
// stores run that math (memstore directly, redisstore as a line-by-line Lua
// port proven equal by a differential test).
//
//	algorithm       burst                               accuracy                 state per subject
//	fixed_window    up to 2×limit around a boundary     exact per window         count + window start
//	sliding_log     none: ≤ limit in every window       exact                    one entry per admitted unit
//	sliding_window  none under the estimate             approximate (weighted)   two counts + window start
//	token_bucket    burst at once, then the rate        exact                    tokens + last refill
//	gcra            burst at once, then evenly spaced   exact                    theoretical arrival time
//
// Pick fixed_window for cheap internal quotas, sliding_log where exactness
// matters more than memory (login, payment), sliding_window for broad API
// quotas with large limits, token_bucket or gcra where bursts are
// legitimate. token_bucket and gcra admit exactly the same requests for the
// same numbers; gcra keeps one timestamp instead of two numbers. Every
// decision is one store call (one EVALSHA on Redis) whatever the algorithm.
//
// # Time
//
// Time is integer microseconds. Nothing below Limiter reads the clock except
// through a Clock (memstore) or Redis TIME (redisstore's default). A clock
// that moves backwards never resets state.
//
// # Subjects
//
// Subject must be a pseudonym, never raw personal data: use
// subject.Pseudonymizer, which keys an HMAC and tags the output with its key
// id so keys can rotate.
package sluice
