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
// # Entry points
//
// Where to start, by what you have:
//
//   - Go code that decides: New over a store, then Limiter.Check. The
//     stores are [github.com/sluicehq/sluice/memstore] (in the process)
//     and [github.com/sluicehq/sluice/redisstore] (Redis, Cluster or
//     Sentinel, one limit for every instance).
//   - A net/http server: [github.com/sluicehq/sluice/httplimit]
//     (httplimit.PerIP for one policy per client address, httplimit.New
//     for routes).
//   - A gRPC server: [github.com/sluicehq/sluice/grpclimit]
//     (grpclimit.New: unary and stream server interceptors).
//   - Who is limited: [github.com/sluicehq/sluice/subject] (keyed
//     pseudonyms, the client address behind trusted proxies, the
//     KeyFunc both middlewares take).
//   - Services in any language: the sluice command's server
//     (go install github.com/sluicehq/sluice/cmd/sluice@latest, then
//     sluice serve) and its HTTP check API; from Go, its client
//     [github.com/sluicehq/sluice/sluiceclient]. The same server answers
//     Envoy as its rate-limit service and runs a rate-limiting reverse
//     proxy.
//   - A store of your own: [github.com/sluicehq/sluice/sluicetest] runs
//     the behavioural suite every store passes.
//
// The README and the pages under docs/ in the repository walk through
// each.
//
// # Algorithms
//
// Every algorithm is an integer state machine, decided by one engine that
// both stores run: memstore in the process, redisstore as a Lua port of it,
// proven equal by a differential test.
//
//	algorithm       burst in a window-long interval              accuracy                 state per subject
//	fixed_window    up to 2×limit−1 around a boundary            exact per window         window start, count
//	sliding_log     none: ≤ limit in every window                exact                    one entry per admitted unit
//	sliding_window  estimate ≤ limit; real count up to ~2×limit  approximate (weighted)   window start, two counts
//	token_bucket    burst at once, then the rate                 exact                    tokens, last refill
//	gcra            burst at once, then evenly spaced            exact                    theoretical arrival time
//
// sliding_window assumes the previous window's requests were spread
// evenly: 100 per second admits 197 within 990ms when 100 arrive in the
// last 10ms of a window and 100 more 970–980ms into the next, and about
// 1.3× to 1.9× the limit under Poisson traffic offered at 1× to 10× it.
//
// A fixed_window opens its window at a subject's first admitted request;
// with Policy.ClockAligned it starts windows on the clock's boundaries of
// the window's length since the Unix epoch (every UTC minute, hour or
// midnight), the same instant for every subject.
//
// Pick fixed_window for cheap internal quotas, sliding_log where exactness
// matters more than memory (login, payment), sliding_window for broad API
// quotas with large limits, token_bucket or gcra where bursts are
// legitimate. token_bucket and gcra admit exactly the same requests for the
// same numbers. Every decision is one store call (one FCALL on Redis, or
// EVALSHA before Redis 7) whatever the algorithm.
//
// # Hot subjects
//
// With Policy.LocalQuota, a Limiter that sees one subject often takes a
// block of units for it in one store decision and admits from the block
// itself (Outcome.Local) until it is spent or its BlockTime is up, so a
// hot subject costs the store one call per block instead of one per
// request. The store spends a block so that it covers every admission
// made from it (Evaluation.Hold), so no number of instances admits more
// than the algorithm allows; what a block leaves unspent stays spent
// (LocalStats.Unused). For fixed_window, token_bucket and gcra.
//
// # Concurrency
//
// The Concurrency algorithm limits how many leases a subject holds at
// once rather than how often it spends: a Request of Op Acquire takes a
// lease on every Concurrency policy it names (Outcome.Lease) when allowed,
// a Release gives it back, a Renew extends it, and a lease
// never released expires after the policy's LeaseTTL, so a crashed holder
// cannot leak a slot. A concurrency policy has a limit and a lease TTL and
// no window; an Acquire may name rate policies beside it, spending Cost on
// them, all or nothing. In Redis its state is a sorted set of leases
// scored by expiry, one per subject and policy.
//
// # Operations
//
// Every Request is one operation (Request.Op): Spend (the zero value),
// Peek, Refund, Reset, Acquire, Release or Renew. What each may name and
// carry is checked once, by the store through the decision engine: a
// Spend names rate policies only, a Refund refundable ones, a Release or
// Renew concurrency policies only, with a lease; Peek, Reset, Release and
// Renew take no cost.
//
// # Time
//
// Time is integer microseconds. Nothing below Limiter reads the clock except
// through a Clock (memstore) or Redis TIME (redisstore's default). A clock
// that moves backwards never resets state: a request behind a state's
// newest write is decided at that write's time, and its RetryAfter is
// measured from its own time, never early.
//
// # Subjects
//
// Subject must be a pseudonym, never raw personal data: use
// subject.Pseudonymizer, which keys an HMAC and tags the output with its key
// id so keys can rotate.
package sluice
