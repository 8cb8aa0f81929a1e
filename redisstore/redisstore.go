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
// Overrides (see Store.PutOverride) add plain HSET, HDEL and HGETALL on
// <Prefix>{overrides} and GET and INCR on <Prefix>{overrides}:version,
// sent by the store itself, never by the decision code. A user
// restricted to exactly that works:
//
//	ACL SETUSER sluice on >PASSWORD resetkeys ~sluice:* resetchannels -@all +fcall +function|load +evalsha +script|load +ping +time +pttl +pexpire +del +get +set +hget +hset +hdel +hgetall +incr +llen +lindex +lrange +ltrim +rpush +zscore +zadd +zcard +zrange +zrangebyscore +zremrangebyscore +zremrangebyrank +zrank +zrem +setrange
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

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/period"
)

// The script's argument and reply layout; args.lua names each alike
// (ARGV_COST, …), and a test holds the two equal.
const (
	argvCost          = 1
	argvNow           = 2
	argvMaxRegression = 3
	argvOp            = 4
	argvID            = 5
	argvDedupeTTL     = 6
	argvDedupeMax     = 7
	argvCarry         = 8
	argvLease         = 9
	argvHold          = 10
	argvPolicies      = 10 // policy i's argument is argvPolicies + i: "kind limit window burst grace align" (+ " r<reserve>" for a priority class's)
	argvPerPolicy     = 1
	carryPerPolicy    = 2 // with carry "carry", after every policy's: policy i's carried state and its TTL in ms
	replyAbsent       = 2 // with carry "probe", the reply {replyAbsent}: a policy has no state, nothing decided
	replyPerPolicy    = 5
	maxGrace          = int64((time.Hour + 24*time.Hour) / time.Microsecond) // CleanupGrace + ExtraTTL
	maxDedupeTTL      = int64(time.Hour / time.Microsecond)
	maxDedupeIDs      = 10000
)

// opArgs are the operations as the script's ARGV_OP spells them, each an
// interface value made once.
var opArgs = func() (a [sluice.Book + 1]any) {
	for o := range a {
		a[o] = sluice.Op(o).String()
	}
	return a
}()

// maxPrefixLen is the longest Options.Prefix, in bytes.
const maxPrefixLen = 64

// Options configure a Store. The zero value means the defaults.
type Options struct {
	// Prefix starts every key, at most 64 bytes without '{' or
	// '}'. Default: "sluice:".
	Prefix string
	// Timeout bounds each round trip to Redis (a pipeline of decisions, or
	// one), as a deadline on its context; a caller's own deadline bounds
	// its wait too. go-redis applies context deadlines to the socket only
	// when the client has ContextTimeoutEnabled; otherwise its ReadTimeout
	// and WriteTimeout bound the call. Negative means no bound beyond the
	// caller's context. Default: 1s.
	Timeout time.Duration
	// Senders is how many pipelines of decisions may be on the wire at
	// once (to each Cluster master apart). Concurrent decisions that find
	// every sender busy go together in the next pipeline, which costs
	// Redis and the client far less than one round trip each; a lone
	// decision is sent at once, never held back by a timer. Negative
	// sends every decision alone, from its caller's goroutine. Default: 2.
	Senders int
	// Lazy is how every Store starts now (see New).
	//
	// Deprecated: New never contacts Redis; Lazy has no effect.
	Lazy bool
	// Breaker configures the circuit breakers that shed decisions while
	// Redis (a Cluster master) is down or hung. Default: see
	// BreakerOptions.
	Breaker BreakerOptions
	// WaitReplicas, when positive, has every decision's writes
	// acknowledged by that many replicas before the decision is
	// answered, for limits where an over-admission after a failover
	// matters (asynchronous replication loses the writes a master
	// acknowledged just before it died). Each decision, or pipeline of
	// them, is followed in the same round trip and on the same connection
	// by WAIT WaitReplicas T, T half the time left before the round
	// trip's deadline (1s without one). A decision Redis took that fewer
	// replicas acknowledged is ErrIndeterminate: spent on the master, it
	// may be lost with it (retry it with its EvaluationID); it counts as a
	// failed round trip for the breaker. Needs a Client, a Sentinel
	// failover client or a Cluster (each master's decisions go through
	// that master's own client, so MOVED is not followed: the decision
	// fails before send and the slot map is reloaded), not a Ring; a
	// restricted user needs +wait. Default: 0, no WAIT.
	WaitReplicas int
	// OnFallback, when set, is called once, with the reason, when the
	// store falls back from its function library to scripts (EVALSHA):
	// at a decision or a readiness check, when Redis has no FUNCTION or refuses the
	// user FUNCTION LOAD or FCALL (an ACL changed at run time). The
	// decision FCALL was refused for is then sent once more as EVALSHA.
	// For logs. Default: nil.
	OnFallback func(reason string)
	// OnSkippedOverride, when set, is called with the reason for each
	// field of the overrides hash that a read skips because this store
	// cannot read it (written by another tool, or in a later sluice's
	// format during a rolling upgrade): the rest still apply. A field is
	// reported at each read of the hash, which happens only when the
	// overrides' version moved. For logs and metrics. Default: nil.
	OnSkippedOverride func(err error)
	// Clock, when set, is the time source of decisions: its time is passed
	// to the script, each key remembers the newest time it was written at,
	// and a caller whose time lies more than MaxClockRegression behind it
	// gets sluice.ClockUnsafe and changes nothing. Default: nil, the time
	// is read with Redis TIME inside the script: one clock for every
	// caller, whatever their own clocks say.
	Clock sluice.Clock
	// MaxClockRegression is, with a Clock, how far a caller's time
	// may lie behind the newest time a key was written at; further behind
	// is sluice.ClockUnsafe. Within the bound the algorithms treat the
	// earlier time as the later one. Negative means unbounded.
	// Default: 1s.
	MaxClockRegression time.Duration
	// ExtraTTL is added to every key's TTL on top of the policy's
	// CleanupGrace. TTLs run on Redis's clock; with a Clock
	// clock that does not advance with it (a fake clock in tests), state
	// could otherwise expire in Redis while it is still live by the
	// caller's clock. Default: 0.
	ExtraTTL time.Duration
}

// Client is what a Store needs of a go-redis client: the commands it
// sends (Process) and its pipelines (Pipeline). *redis.Client (the
// Sentinel failover client of redis.NewFailoverClient is one),
// *redis.ClusterClient, *redis.Ring, and any type of an application's
// that embeds one of them (a wrapper adding tracing, say) provide it.
//
// The store learns what lies behind a Client from the methods it has,
// whatever its type. A Redis Cluster has those of *redis.ClusterClient
//
//	ForEachMaster(ctx context.Context, fn func(context.Context, *redis.Client) error) error
//	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
//
// and the store loads its code on every master, keeps a breaker and
// senders per master, and sends each master's decisions as pipelines of
// their own calls (their keys lie in different slots). A Ring has
// ForEachShard, of ForEachMaster's signature, and not those: the store
// loads its code on every shard and keeps one breaker. Anything else is
// one Redis, whose queued decisions share calls. A cluster client with
// ReloadState(context.Context) reloads its slot map after a round trip
// fails for want of Redis.
type Client interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// clusterClient is a Client to a Redis Cluster.
type clusterClient interface {
	ForEachMaster(ctx context.Context, fn func(context.Context, *redis.Client) error) error
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// ringClient is a Client to a Ring.
type ringClient interface {
	ForEachShard(ctx context.Context, fn func(context.Context, *redis.Client) error) error
}

// Store is the Redis store. Create it with New; the zero value is not
// usable. Safe for concurrent use. Its sender goroutines (and, while
// Redis fails, its breakers' probes, and a readiness check Ready began)
// stop on Close, which does not close the client: that stays the
// caller's.
type Store struct {
	client   Client
	cluster  clusterClient // nil unless a Cluster
	ring     ringClient    // nil unless a Ring
	prefix   string
	timeout  time.Duration
	clock    sluice.Clock // nil: Redis TIME
	maxReg   any          // ARGV_MAX_REGRESSION, a string
	extra    time.Duration
	replicas int         // WaitReplicas
	scripts  atomic.Bool // the code is loaded as a script, not a function library
	// policyArgs caches each policy's formatted arguments:
	// *sluice.Policy → *policyArgs, about cachedArgs of them.
	policyArgs sync.Map
	cachedArgs atomic.Int64
	batchAll   bool // every decision through the senders in a decideAll call, even alone (tests)
	// onRedisTime, when set, is called with the time each decision on
	// Redis time was taken at, from its reply (tests: the differential
	// test decides it again at that time).
	onRedisTime func(now int64)
	// periods keeps calendar periods' bounds around this process's clock
	// (the caller's, or on Redis time the system's); periodBounds, when
	// set, replaces them (tests: periods of a few ms around Redis time).
	periods      period.Cache
	periodBounds func(p *sluice.Policy) [4]int64
	onFallback   func(string)
	onSkipped    func(error) // Options.OnSkippedOverride

	// The nodes decisions go to: one, the store's Redis (on a Cluster,
	// the decisions whose master cannot be told, routed by the cluster
	// client), and a Cluster's masters by address.
	one         *node
	nodes       sync.Map // address → *node
	nodesMu     sync.Mutex
	closed      bool // guarded by nodesMu
	senders     int  // per node; 0: every decision is sent alone by its caller
	breakerOpts BreakerOptions

	// The store's breaker state, its worst node's, for OnChange.
	stateMu  sync.Mutex
	state    string
	states   map[*node]string // the nodes not closed
	seqs     map[*node]uint64
	onChange func(string)

	// Ready's checks: at most one runs, in the background, bounded by
	// Timeout; Ready waits readyWait for it at most.
	checkMu   sync.Mutex
	checking  chan struct{} // closed when the running check ends; nil: none runs
	lastCheck atomic.Pointer[check]
	bgCtx     context.Context
	bgStop    context.CancelFunc
	bg        sync.WaitGroup

	ovrCache atomic.Pointer[overrideCache] // the overrides as last read: see overrides.go
}

// check is what a readiness check found besides what it recorded on each
// node: a Cluster's masters at the time (nil otherwise, or when the slot
// map could not be had).
type check struct {
	masters map[string]bool
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store over client and starts its senders, without
// contacting Redis (see Start in the package doc): its error is only for
// invalid options, naming the option, its value and the rule.
func New(client Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New: client is nil")
	}
	if opts.Prefix == "" {
		opts.Prefix = "sluice:"
	}
	if len(opts.Prefix) > maxPrefixLen || strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: New: prefix %q: must be at most %d bytes without '{' or '}'", opts.Prefix, maxPrefixLen)
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	if opts.ExtraTTL < 0 || opts.ExtraTTL > 24*time.Hour {
		return nil, fmt.Errorf("redisstore: New: ExtraTTL = %v: must be between 0 and 24h", opts.ExtraTTL)
	}
	s := &Store{client: client, prefix: opts.Prefix, timeout: opts.Timeout, maxReg: "-1", extra: opts.ExtraTTL,
		onFallback: opts.OnFallback, onSkipped: opts.OnSkippedOverride, breakerOpts: opts.Breaker, onChange: opts.Breaker.OnChange, state: "closed",
		states: map[*node]string{}, seqs: map[*node]uint64{}}
	if c, ok := client.(clusterClient); ok {
		s.cluster = c
	} else if r, ok := client.(ringClient); ok {
		s.ring = r
	}
	switch {
	case opts.WaitReplicas < 0:
		return nil, fmt.Errorf("redisstore: New: WaitReplicas = %d: must not be negative", opts.WaitReplicas)
	case opts.WaitReplicas > 0 && s.ring != nil:
		return nil, errors.New("redisstore: New: WaitReplicas needs a Client, Sentinel or Cluster, not a Ring")
	}
	s.replicas = opts.WaitReplicas
	if s.clock = opts.Clock; s.clock != nil {
		switch {
		case opts.MaxClockRegression == 0:
			s.maxReg = strconv.FormatInt(time.Second.Microseconds(), 10)
		case opts.MaxClockRegression > 0:
			s.maxReg = strconv.FormatInt(opts.MaxClockRegression.Microseconds(), 10)
		}
	}
	switch {
	case opts.Senders == 0:
		s.senders = 2
	case opts.Senders > 0:
		s.senders = opts.Senders
	}
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	s.one = s.newNode("", nil)
	return s, nil
}

// Close stops the store's sender goroutines, its breakers' probes and a
// readiness check that runs; decisions asked afterwards, or still
// queued, fail before send. The client stays the caller's.
func (s *Store) Close() error {
	s.nodesMu.Lock()
	if s.closed {
		s.nodesMu.Unlock()
		return nil
	}
	s.closed = true
	s.nodesMu.Unlock()
	s.bgStop()
	s.eachNode(func(n *node) {
		if n.batch != nil {
			n.batch.close()
		}
		n.breaker.close()
	})
	s.bg.Wait()
	return nil
}

// readyWait is the longest Ready waits on Redis.
const readyWait = 50 * time.Millisecond

// Ready reports whether the store can take decisions: whether Redis
// answers and holds the decision code on every master. It answers from
// what the store knows, without waiting on Redis: not ready while a
// breaker is open (the master named) or when the newest round trip to a
// master (a decision's, a probe's or a check's) failed, or before any
// round trip has succeeded. A check loads the code on every master where
// it is missing (and on a Cluster learns which nodes are the masters);
// Ready starts one in the background unless one runs, bounded by
// Options.Timeout, and waits for it at most 50ms (less if ctx ends
// first): a hung Redis costs a readiness probe no timeout, and what a
// check that has not answered by then finds counts for the next Ready.
func (s *Store) Ready(ctx context.Context) error {
	done := s.check()
	if err := s.readiness(true); err != nil {
		return err // an open breaker: no check can say otherwise
	}
	t := time.NewTimer(readyWait)
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	return s.readiness(false)
}

// readiness is Ready's answer from what the store knows now; openOnly:
// nil unless a breaker is open.
func (s *Store) readiness(openOnly bool) error {
	var masters map[string]bool // nil: every node the store knows
	if last := s.lastCheck.Load(); last != nil {
		masters = last.masters
	}
	var err error
	answered := false
	s.eachNode(func(n *node) {
		if n != s.one && masters != nil && !masters[n.addr] {
			return // not a master at the last check: its slots are served elsewhere
		}
		switch {
		case err != nil:
		case n.breaker.isOpen():
			err = n.errOpen
		case openOnly:
		case n.last.Load() != nil:
			err = *n.last.Load()
		case n.answered.Load():
			answered = true
		}
	})
	if err == nil && !answered && !openOnly {
		err = fmt.Errorf("redisstore: no answer from Redis within %v yet", readyWait)
	}
	if err != nil {
		return fmt.Errorf("redisstore: not ready: %w", err)
	}
	return nil
}

// check returns a channel closed when the running readiness check ends,
// starting one if none runs.
func (s *Store) check() <-chan struct{} {
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	if s.checking != nil {
		return s.checking
	}
	done := make(chan struct{})
	if s.bgCtx.Err() != nil {
		close(done) // closed
		return done
	}
	s.checking = done
	s.bg.Go(func() {
		ctx, cancel := s.callContext(s.bgCtx)
		c := s.runCheck(ctx)
		cancel()
		s.lastCheck.Store(c)
		s.checkMu.Lock()
		s.checking = nil
		s.checkMu.Unlock()
		close(done)
	})
	return done
}

// runCheck loads the code on every master (on a Ring every shard, or the
// one Redis), except where a breaker is open, and records each round
// trip on its node.
func (s *Store) runCheck(ctx context.Context) *check {
	on := func(ctx context.Context, n *node, load func(context.Context) error) {
		if n.breaker.isOpen() {
			return // Ready says so; the probe tells when that Redis answers
		}
		err := load(ctx)
		if err != nil {
			// A failed dial wrote nothing: say so, not "sent, no reply".
			var op *net.OpError
			err = s.typeErr(ctx, "load the code", !errors.As(err, &op) || op.Op != "dial", err)
		}
		s.record(ctx, n, err)
	}
	switch {
	case s.ring != nil:
		on(ctx, s.one, s.load) // one breaker for the shards
		return &check{}
	case s.cluster == nil:
		on(ctx, s.one, func(ctx context.Context) error { return s.loadOn(ctx, s.client) })
		return &check{}
	}
	var mu sync.Mutex
	masters := map[string]bool{}
	err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n := s.nodeOf(c)
		mu.Lock()
		masters[n.addr] = true
		mu.Unlock()
		on(ctx, n, func(ctx context.Context) error { return s.loadOn(ctx, c) })
		return nil
	})
	if len(masters) == 0 {
		// No slot map: the decisions the store's own node routes cannot
		// be sent either.
		if err != nil {
			err = s.typeErr(ctx, "read the cluster's slot map", false, err)
		}
		s.record(ctx, s.one, err)
		return &check{}
	}
	s.record(ctx, s.one, nil)
	return &check{masters: masters}
}

// callContext returns ctx bounded by the store's Timeout. A ctx whose own
// deadline comes first is returned as it is: a derived context and its
// timer would cost every such call (the check API's, the middleware's)
// and bound nothing more.
func (s *Store) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout <= 0 {
		return ctx, noCancel
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.timeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.timeout)
}

func noCancel() {}

// algorithmCodes name each algorithm in keys.
var algorithmCodes = [...]string{
	sluice.FixedWindow:   "f",
	sluice.SlidingLog:    "l",
	sluice.SlidingWindow: "w",
	sluice.TokenBucket:   "t",
	sluice.GCRA:          "g",
	sluice.Concurrency:   "c",
}

// key returns the Redis key of p's state for subject: see the package
// documentation.
func (s *Store) key(subject string, p *sluice.Policy) string {
	return s.policyKey(subject, p, s.stateSuffix(p))
}

// appendKey appends key's key to b.
func (s *Store) appendKey(b []byte, subject string, p *sluice.Policy) []byte {
	return s.appendPolicyKey(b, subject, p, s.stateSuffix(p))
}

// stateSuffix returns the last part of p's state key: the code of the
// record it keeps.
func (s *Store) stateSuffix(p *sluice.Policy) string {
	switch {
	case p.Period != "":
		return "p" // a calendar period's (algorithm.FixedPeriod), on either clock
	case p.Algorithm == sluice.FixedWindow && s.clock == nil && p.ClockAligned:
		// On Redis time a fixed window keeps another record
		// (algorithm.FixedWindowEnd): another key.
		return "E"
	case p.Algorithm == sluice.FixedWindow && s.clock == nil:
		return "e"
	case p.ClockAligned:
		return "F" // another window than first-request's: another key
	}
	return algorithmCodes[p.Algorithm]
}

// policyKey returns the key of p for subject that ends in suffix: the
// algorithm code of its state, or one of the evaluation-id records.
func (s *Store) policyKey(subject string, p *sluice.Policy, suffix string) string {
	var room [128]byte
	return string(s.appendPolicyKey(room[:0], subject, p, suffix))
}

// appendPolicyKey appends policyKey's key to b.
func (s *Store) appendPolicyKey(b []byte, subject string, p *sluice.Policy, suffix string) []byte {
	b = append(b, s.prefix...)
	b = append(b, '{')
	b = append(b, subject...)
	b = append(b, '}')
	b = append(b, p.ID...)
	b = append(b, ':')
	b = strconv.AppendInt(b, p.Revision, 10)
	b = append(b, ':')
	return append(b, suffix...)
}

// Evaluate implements sluice.Store.
func (s *Store) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var room [4]algorithm.Policy
	if err := evaluation.Check(ev, room[:]); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	n := len(ev.Policies)
	id := ""
	if algorithm.RecordID(ev.EvaluationID, evaluation.Op(ev)) != "" {
		id = ev.EvaluationID // the script derives the record id alike
	}
	var vals []int64
	var reply [1 + replyPerPolicy*2]int64 // the reply, where it fits
	var err error
	switch {
	case len(ev.Previous) == 0:
		vals, err = s.decide(ctx, ev.Subject, ev, id, "", nil, reply[:0])
	case ev.Op == sluice.Reset:
		for _, prev := range ev.Previous {
			if _, err := s.decide(ctx, prev, ev, "", "", nil, reply[:0]); err != nil {
				return err
			}
		}
		vals, err = s.decide(ctx, ev.Subject, ev, id, "", nil, reply[:0])
	default:
		// A key rotation: decide unless a policy has no state under
		// Subject; then read the older subjects' and decide again, the
		// script keeping what it carries over.
		vals, err = s.decide(ctx, ev.Subject, ev, id, "probe", nil, reply[:0])
		if err == nil && len(vals) == 1 && vals[0] == replyAbsent {
			var carried []any
			if carried, err = s.previous(ctx, ev); err == nil {
				vals, err = s.decide(ctx, ev.Subject, ev, id, "carry", carried, reply[:0])
			}
		}
	}
	if err != nil {
		return err
	}
	extra := 0 // a settle's charged, given back and owed of each policy follow the decisions, a book's delay its one
	switch ev.Op {
	case sluice.Settle:
		extra = 3 * n
	case sluice.Book:
		extra = 1
	}
	switch {
	case len(vals) == 2+replyPerPolicy*n+extra && s.clock == nil:
		// On Redis time the reply ends with the time it decided at.
		if s.onRedisTime != nil {
			s.onRedisTime(vals[len(vals)-1])
		}
	case len(vals) != 1+replyPerPolicy*n+extra || s.clock == nil:
		return fmt.Errorf("redisstore: %w: the script answered %d values for %d policies", sluice.ErrIndeterminate, len(vals), n)
	}
	ev.Replayed = vals[0] == 1
	ev.Statuses = evaluation.Statuses(ev.Statuses, n)
	for i, p := range ev.Policies {
		v := vals[1+replyPerPolicy*i:]
		d := algorithm.Decision{Allowed: v[0] == 1, Limit: v[1], Remaining: v[2], ResetAfter: v[3], RetryAfter: v[4]}
		if ev.Op == sluice.Book {
			d.Delay = vals[1+replyPerPolicy*n]
		}
		evaluation.SetStatus(&ev.Statuses[i], p, &d)
	}
	if ev.Op == sluice.Settle {
		evaluation.SetSettled(ev.Statuses, vals[1+replyPerPolicy*n:1+replyPerPolicy*n+extra])
	}
	return nil
}

// holdArg returns h, a held spend's hold that passed Check (whole µs),
// as the script's argument: µs.
func holdArg(h time.Duration) any {
	if h == 0 {
		return smallInts[0]
	}
	return strconv.FormatInt(int64(h/time.Microsecond), 10)
}

// decide runs the script once for subject: ev's decision, with carry ""
// (none), "probe" or "carry" and the carried states (see redisstore.lua and carry.lua).
// It appends the reply's integers to dst.
func (s *Store) decide(ctx context.Context, subject string, ev *sluice.Evaluation, id, carry string, carried []any, dst []int64) ([]int64, error) {
	if evaluation.Short(ev) {
		return s.decideShort(ctx, subject, ev, dst)
	}
	n := len(ev.Policies)
	keys := n
	if id != "" {
		keys += 2
	}
	nargv := argvPolicies + argvPerPolicy*n + len(carried)
	p := pendingPool.Get().(*pending)
	p.state.Store(queued)
	args := slices.Grow(p.args[:0], 3+keys+nargv)[:3+keys+nargv]
	p.args, p.keys, p.alone = args, keys, carry == "carry"
	cmdName, code := s.call()
	args[0], args[1], args[2] = cmdName, code, intArg(int64(keys))
	p.key.b = s.appendKey(p.key.b[:0], subject, ev.Policies[0])
	args[3] = &p.key
	for i, p := range ev.Policies[1:] {
		args[4+i] = s.key(subject, p)
	}
	first := ev.Policies[0]
	if id != "" {
		args[3+n], args[3+n+1] = s.policyKey(subject, first, "ids"), s.policyKey(subject, first, "idv")
	}
	argv := args[3+keys-1:] // argv[i] is ARGV[i]
	argv[argvNow] = ""
	if s.clock != nil {
		argv[argvNow] = strconv.FormatInt(evaluation.Now(s.clock), 10)
	}
	argv[argvOp] = opArgs[ev.Op]
	argv[argvLease] = ev.LeaseID
	if ev.Op == sluice.Book {
		argv[argvHold] = holdArg(ev.MaxWait) // a book's most wait rides in the hold's slot: it is never held
	} else {
		argv[argvHold] = holdArg(ev.Hold)
	}
	argv[argvCost] = intArg(ev.Cost)
	argv[argvMaxRegression] = s.maxReg
	argv[argvID] = ""
	argv[argvDedupeTTL], argv[argvDedupeMax] = "", ""
	if id != "" {
		fa := s.argsOf(first, 0) // its dedupe numbers
		argv[argvID] = id
		argv[argvDedupeTTL], argv[argvDedupeMax] = fa.dedupeTTL, fa.dedupeN
	}
	argv[argvCarry] = carry
	op := evaluation.Op(ev)
	for i, p := range ev.Policies {
		argv[argvPolicies+i+1] = s.argsOf(p, evaluation.Reserve(p, ev.Priority, op)).arg
	}
	copy(argv[argvPolicies+argvPerPolicy*n+1:], carried)
	return s.send(ctx, p, ev, dst)
}

// previous reads the state of ev's policies under ev.Previous, one
// pipeline per older subject (its keys share one slot), and returns the
// script's carry arguments: for each policy, the state of the first
// subject that has one (a fixed-size state as stored, a log's entries
// joined by ',', a concurrency policy's leases as id,expiry pairs joined
// by ','; "" for none) and its TTL in ms.
func (s *Store) previous(ctx context.Context, ev *sluice.Evaluation) ([]any, error) {
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	n := len(ev.Policies)
	out := make([]any, carryPerPolicy*n)
	for i := range out {
		out[i] = ""
	}
	for _, prev := range ev.Previous {
		states := make([]redis.Cmder, n)
		ttls := make([]*redis.DurationCmd, n)
		pipe := s.client.Pipeline()
		for i, p := range ev.Policies {
			if out[carryPerPolicy*i] != "" {
				continue
			}
			k := s.key(prev, p)
			switch p.Algorithm {
			case sluice.SlidingLog:
				states[i] = pipe.LRange(ctx, k, 0, -1)
			case sluice.Concurrency:
				states[i] = pipe.ZRangeWithScores(ctx, k, 0, -1)
			default:
				states[i] = pipe.Get(ctx, k)
			}
			ttls[i] = pipe.PTTL(ctx, k)
		}
		_, err := pipe.Exec(ctx)
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, s.classifyRead(ctx, "read the state of an older subject", err)
		}
		for i, c := range states {
			if c == nil || ttls[i].Val() <= 0 {
				continue
			}
			var raw string
			switch c := c.(type) {
			case *redis.StringCmd:
				raw = c.Val()
			case *redis.StringSliceCmd:
				raw = strings.Join(c.Val(), ",")
			case *redis.ZSliceCmd:
				var b strings.Builder
				for j, z := range c.Val() {
					if j > 0 {
						b.WriteByte(',')
					}
					fmt.Fprint(&b, z.Member)
					b.WriteByte(',')
					b.WriteString(strconv.FormatFloat(z.Score, 'f', -1, 64)) // the script checks it is an integer
				}
				raw = b.String()
			}
			if raw != "" {
				out[carryPerPolicy*i] = raw
				out[carryPerPolicy*i+1] = strconv.FormatInt(ttls[i].Val().Milliseconds(), 10)
			}
		}
	}
	return out, nil
}

// refusedBeforeRun are error replies with which Redis refuses a script
// before it runs, or at its first write (nothing written yet: the script
// writes only after every read and check).
var refusedBeforeRun = []string{
	"NOSCRIPT", "NOPERM", "NOAUTH", "WRONGPASS", "CROSSSLOT", "CLUSTERDOWN",
	"MOVED", "ASK", "TRYAGAIN", "LOADING", "BUSY", "MASTERDOWN", "READONLY",
	"OOM", "MISCONF", "NOREPLICAS", "MAXCLIENTS",
}

// classifyRead is classify for round trips that only read: nothing was
// spent, whatever happened, so what classify calls Indeterminate is
// FailedBeforeSend (Unavailable: the breaker counts it all the same).
func (s *Store) classifyRead(ctx context.Context, what string, err error) error {
	if err = s.classify(ctx, what, err); errors.Is(err, sluice.ErrIndeterminate) {
		return fmt.Errorf("redisstore: %s: %w: %v", what, sluice.FailedBeforeSend, err)
	}
	return err
}

// classify wraps err, from doing what, in the sentinel that types it.
func (s *Store) classify(ctx context.Context, what string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrClosed) {
		msg := rerr.Error()
		code, reason, _ := strings.Cut(msg, " ")
		if sentinel := scriptError(code); sentinel == sluice.ErrInvalidRequest {
			// Worded as the engine words its Go twin's refusal (memstore's):
			// the rule, without the script's code.
			return fmt.Errorf("redisstore: %w", fmt.Errorf("%w: %s", sentinel, reason))
		} else if sentinel != nil {
			return fmt.Errorf("redisstore: %s: %w", msg, sentinel)
		}
		for _, c := range refusedBeforeRun {
			if code == c {
				return fmt.Errorf("redisstore: %s: redis refused: %s: %w", what, msg, sluice.FailedBeforeSend)
			}
		}
		return fmt.Errorf("redisstore: %s: %s: %w", what, msg, sluice.ErrIndeterminate)
	}
	var op *net.OpError
	switch {
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.FailedBeforeSend, err)
	case errors.As(err, &op) && op.Op == "dial":
		return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.FailedBeforeSend, err)
	case errors.As(err, &op) && op.Op == "write":
		// A failed write left the command incomplete on the wire: a Redis
		// server executes only complete commands.
		return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.FailedBeforeSend, err)
	case op == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && ctx.Err() != nil:
		// go-redis returns a bare context error only while waiting for a
		// connection, dialling or setting a new one up (a Redis that
		// accepts and never answers); a read cut short by the deadline is
		// a *net.OpError timeout. The deadline is the store's (Timeout),
		// not the caller's: Redis failed to take the command in time.
		return fmt.Errorf("redisstore: %s: nothing sent within the store's timeout (%v): %w", what, err, sluice.FailedBeforeSend)
	}
	return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.ErrIndeterminate, err)
}
