// Package redisstore is the shared sluice.Store: every decision is one
// call of Lua code in Redis that runs sluice's decision engine, ported
// function by function from Go, so any number of application instances
// share one limit through one Redis, a Sentinel-managed Redis, or a Redis
// Cluster.
//
// # Calls
//
// New takes a Client: *redis.Client (Sentinel failover clients too),
// *redis.ClusterClient, *redis.Ring, or an application's own type that
// embeds one; the store tells a Cluster and a Ring by their methods, not
// their types (see Client). On Redis 7 and later the code is a function
// library (FUNCTION LOAD once per master) and each decision one FCALL;
// before Redis 7, or for a user not allowed FUNCTION LOAD or FCALL, it is
// a script (SCRIPT LOAD) and each decision one EVALSHA. Decisions that
// meet at a Store while its senders are on the wire go to Redis together
// in one round trip (Options.Senders, per Cluster master), each with its
// own reply; a lone decision is sent at once. To one Redis (a Client,
// Sentinel-managed or not) they go as calls of the library's second
// function, which takes up to 64 decisions in one FCALL, each exactly as
// alone and with its own reply or error; to a Cluster master or a Ring,
// as a pipeline of one call per decision. With Options.WaitReplicas,
// each round trip ends with a WAIT on the same connection.
//
// The common decision (one policy, a spend or a peek, or a lease's
// acquire or release; no evaluation id, no Previous subjects) goes in a
// short form: its cost or lease and its policy, decided by the same Lua
// functions as any other, on values rather than tables, with one read
// and at most one write of a fixed-size state. At 64 callers on 10 000
// subjects, allowed, it costs redis-server about 61 000 instructions
// (token_bucket), 63 000 (gcra), 66 000 (fixed_window), 73 000
// (sliding_window) and 99 000 (sliding_log); a lease's acquire and
// release about 154 000 together (BENCHMARKS.md, `cd bench &&
// ./instructions.sh`).
//
// # Start
//
// New does not contact Redis, so an application starts while Redis is
// down, hung or not yet reachable, as sluice serve does: decisions fail
// before send (Unavailable, FailedBeforeSend, nothing spent, so each
// policy's failure mode answers; soon shed by the circuit breaker) with
// the client's own error, e.g. "dial tcp 10.0.0.9:6379: connect:
// connection refused", until Redis answers; then the first decision to
// reach a node that lacks the decision code gets "function not found"
// (NOSCRIPT for a script), loads the code there and is sent once more.
// New's error is for invalid options only. An application that must not
// start without Redis asks Ready until it answers nil: its error says
// what Redis answered, e.g. the refused dial.
//
// # Keys
//
// The state of policy P (revision R) for subject S lives under
//
//	<Prefix>{<S>}<P>:<R>:<algorithm>     e.g. sluice:{k1:3q2x…}login:1:l
//
// The braces make S the Cluster hash tag, so every key of one decision lies
// in one slot and a multi-policy decision is one atomic script call, never
// CROSSSLOT. The algorithm code (f fixed_window, F fixed_window aligned
// to the clock, on Redis time e and E, p fixed_window with a calendar
// period (its end, count and newest write, on either clock), l
// sliding_log, w sliding_window, t token_bucket, g gcra)
// keeps a policy whose algorithm or alignment changed without a revision
// bump from reading the other's state. Keys are
// at most len(Prefix) + 290 bytes. Every key the script writes carries a
// TTL: the time until its state equals an absent one, plus the policy's
// CleanupGrace, rounded up to the millisecond.
//
// State: one string per fixed-size algorithm, the byte 1 and then its
// integer fields as little-endian IEEE doubles in the engine's order
// (e.g. fixed_window start, count, last: 25 bytes; times in µs;
// token_bucket and gcra also keep the numbers they were written under, so
// a policy changed under the same revision is read right; every state
// keeps its newest write time, for the clock rule);
// sliding_log a list of admission times in µs, one entry per admitted
// unit. A decision reads a string state with one GET and writes it with
// one SET … PX.
//
// # Least-privilege ACL
//
// The store sends FCALL and FUNCTION LOAD, or EVALSHA and SCRIPT LOAD (never
// EVAL), and it and its code call only TIME, PTTL, PEXPIRE, DEL, GET, SET, SETRANGE, HGET, HSET, HDEL, LLEN, LINDEX,
// LRANGE, LTRIM, RPUSH, ZSCORE, ZADD, ZCARD, ZRANGE, ZRANGEBYSCORE, ZREMRANGEBYSCORE,
// ZREMRANGEBYRANK, ZRANK and ZREM on keys under Prefix (LRANGE and ZRANGE
// with scores read an older subject's state during a key rotation).
// Overrides (see Store.PutOverride) add plain HDEL and HGETALL on
// <Prefix>{overrides} and GET on <Prefix>{overrides}:version, and a
// small script of their own (EVALSHA) calling HLEN, HGET, HSET and INCR
// on those keys, sent by the store itself, never by the decision code. A user
// restricted to exactly that works:
//
//	ACL SETUSER sluice on >PASSWORD resetkeys ~sluice:* resetchannels -@all +fcall +function|load +evalsha +script|load +ping +time +pttl +pexpire +del +get +set +hget +hmget +hset +hdel +hgetall +hlen +incr +llen +lindex +lrange +ltrim +rpush +zscore +zadd +zcard +zrange +zrangebyscore +zremrangebyscore +zremrangebyrank +zrank +zrem +setrange
//
// A cluster client additionally needs +cluster|slots +cluster|shards
// +command for its topology discovery; Options.WaitReplicas needs +wait.
//
// # Failures
//
// Errors wrap the sluice sentinels so sluice.Limiter can type the outcome:
// a context already done returns the context error and sends nothing, as
// does a decision its caller cancelled or gave up on before it was
// written; a decision never written (dial refused or cut short, a
// connection that could not be set up before the deadline, pool timeout,
// client closed, write error) or refused by Redis before the script ran
// wraps sluice.FailedBeforeSend; a decision written that got no reply (read
// timeout, reset, EOF, a deadline, the store's or its caller's, passing
// while it waited) wraps sluice.ErrIndeterminate: it may have run. The
// store knows whether a command was written because go-redis asks the
// command for its bytes only then. State the script did not write wraps
// sluice.CorruptState; a caller clock too far behind wraps
// sluice.ClockUnsafe. The decision command is marked not retryable, so
// go-redis's MaxRetries never replays a decision, or a pipeline holding
// one, whose reply was lost (which could spend twice); only a node's
// answer that it does not hold the code (NOSCRIPT, "Function not found")
// or will not run FCALL (NOPERM for fcall, unknown command), which proves
// the decision did not run, is retried, once, after loading the code on
// that node (as a script, for good, when FCALL was refused). Which
// failures open the circuit breakers is told at BreakerOptions.Failures.
//
// # Evaluation ids
//
// A decision with an Evaluation.EvaluationID is remembered in the same
// script call that takes it, under two keys of the subject's slot named
// after the first policy: <Prefix>{<S>}<P>:<R>:ids, a sorted set of ids
// scored by expiry, and <Prefix>{<S>}<P>:<R>:idv, a hash of id to reply.
// A repeat within the first policy's DedupeTTL gets the remembered reply
// (Evaluation.Replayed) and spends nothing; beyond DedupeMax ids the one
// expiring first is forgotten. Both keys expire with their newest record.
package redisstore
