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
//   - Go code that decides: New over a store, then Limiter.Check. The
//     stores are [github.com/sluicehq/sluice/memstore] (in the process)
//     and [github.com/sluicehq/sluice/redisstore] (Redis, Cluster or
//     Sentinel, one limit for every instance). Limiter.Wait waits for a
//     slot booked on the shared budget instead of failing, as
//     x/time/rate's Wait does in one process (gcra, token_bucket).
//   - A net/http server: [github.com/sluicehq/sluice/httplimit]
//     (httplimit.PerIP for one policy per client address, httplimit.New
//     for routes); a gRPC server: [github.com/sluicehq/sluice/grpclimit];
//     what either answers while the store cannot decide:
//     [github.com/sluicehq/sluice/failure].
//   - Who is limited: [github.com/sluicehq/sluice/subject] (keyed
//     pseudonyms, the client address behind trusted proxies, the
//     KeyFunc both middlewares take).
//   - Services in any language: the sluice command's server
//     (go install github.com/sluicehq/sluice/cmd/sluice@latest, then
//     sluice serve), its HTTP check API, Envoy's rate-limit service and a
//     rate-limiting reverse proxy; from Go, its client
//     [github.com/sluicehq/sluice/sluiceclient].
//   - A store of your own: [github.com/sluicehq/sluice/sluicetest] runs
//     the behavioural suite every store passes.
//
// The README and the pages under docs/ in the repository walk through
// each.
//
// # Algorithms
//
// Every algorithm is an integer state machine (time in integer
// microseconds), decided by one engine that both stores run, redisstore
// as a Lua port of it proven equal by a differential test; every decision
// is one store call. Pick fixed_window for cheap internal quotas (up to
// 2×limit−1 around a boundary; Policy.ClockAligned puts the boundaries
// on the clock, Policy.Period on the calendar), sliding_log where
// exactness matters more than memory (login, payment), sliding_window
// for broad API quotas with large limits (approximate), token_bucket or
// gcra (which admit the same requests) where bursts are legitimate.
// Concurrency limits the leases a subject holds at once (Op Acquire,
// Release, Renew), each expiring after the policy's LeaseTTL, so a
// crashed holder cannot leak a slot. docs/algorithms.md in the repository
// compares them.
//
// Policy.LocalQuota lets a Limiter admit a hot subject from blocks of
// units it takes in one store decision (Outcome.Local), never more than
// the algorithm allows, however many instances; Policy.NearCache lets it
// repeat a denial until its retry time without asking the store.
//
// A clock that moves backwards never resets state: a request behind a
// state's newest write is decided at that write's time. Subject must be
// a pseudonym, never raw personal data: see subject.Pseudonymizer.
package sluice
