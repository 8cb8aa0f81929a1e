// Package redisstore is the shared sluice.Store: every decision is one
// call of Lua code in Redis that runs sluice's decision engine, ported
// function by function from Go, so any number of application instances
// share one limit through one Redis, a Sentinel-managed Redis, or a Redis
// Cluster.
//
// # Calls
//
// On Redis 7 and later the code is a function library (FUNCTION LOAD once
// per master) and each decision one FCALL; before Redis 7, or for a user
// not allowed FUNCTION LOAD, it is a script (SCRIPT LOAD) and each
// decision one EVALSHA. Decisions that meet at a Store while its senders
// are on the wire go to Redis together in one round trip
// (Options.Senders), each with its own reply; a lone decision is sent at
// once. To one Redis (a Client, Sentinel-managed or not) they go as calls
// of the library's second function, which takes up to 64 decisions in one
// FCALL, each exactly as alone and with its own reply or error; to a
// Cluster or a Ring, as a pipeline of one call per decision.
//
// # Keys
//
// The state of policy P (revision R) for subject S lives under
//
//	<Prefix>{<S>}<P>:<R>:<algorithm>     e.g. sluice:{k1:3q2x…}login:1:l
//
// The braces make S the Cluster hash tag, so every key of one decision lies
// in one slot and a multi-policy decision is one atomic script call, never
// CROSSSLOT. The algorithm code (f fixed_window, l sliding_log, w
// sliding_window, t token_bucket, g gcra) keeps a policy whose algorithm
// changed without a revision bump from reading the other's state. Keys are
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
// EVAL), and it and its code call only TIME, PTTL, PEXPIRE, DEL, GET, SET, HGET, HSET, HDEL, LLEN, LINDEX,
// LRANGE, LTRIM, RPUSH, ZSCORE, ZADD, ZCARD, ZRANGE, ZRANGEBYSCORE, ZREMRANGEBYSCORE,
// ZREMRANGEBYRANK, ZRANK and ZREM on keys under Prefix (LRANGE and ZRANGE
// with scores read an older subject's state during a key rotation). A user
// restricted to exactly that works:
//
//	ACL SETUSER sluice on >PASSWORD resetkeys ~sluice:* resetchannels -@all +fcall +function|load +evalsha +script|load +ping +time +pttl +pexpire +del +get +set +hget +hset +hdel +llen +lindex +lrange +ltrim +rpush +zscore +zadd +zcard +zrange +zrangebyscore +zremrangebyscore +zremrangebyrank +zrank +zrem
//
// A cluster client additionally needs +cluster|slots +cluster|shards
// +command for its topology discovery.
//
// # Failures
//
// Errors wrap the sluice sentinels so sluice.Limiter can type the outcome:
// a context already done returns the context error and sends nothing; a
// failure before the command was written (dial refused, pool timeout,
// client closed, write error, Redis refusing the call before the script
// ran) wraps sluice.FailedBeforeSend; a lost reply (read timeout, reset, EOF
// after the write) wraps sluice.ErrIndeterminate; state the script did not
// write wraps sluice.CorruptState; a caller clock too far behind wraps
// sluice.ClockUnsafe; a pipeline cut short by its deadline makes each
// of its decisions ErrIndeterminate. The decision command is marked not
// retryable, so go-redis's MaxRetries never replays a decision, or a
// pipeline holding one, whose reply was lost (which could spend twice);
// only a node's answer that it does not hold the code (NOSCRIPT, "Function
// not found"), which proves the decision did not run, is retried, once,
// after loading it on that node.
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
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/engine/evaluation"
)

// The script's argument and reply layout; redisstore.lua names each alike
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
	argvPolicies      = 9 // policy i's argument is argvPolicies + i: "kind limit window burst grace"
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
var opArgs = func() (a [sluice.Renew + 1]any) {
	for o := range a {
		a[o] = sluice.Op(o).String()
	}
	return a
}()

// MaxPrefixLen is the longest Options.Prefix, in bytes.
const MaxPrefixLen = 64

// ClockMode selects the time source of decisions.
type ClockMode uint8

const (
	// RedisTime reads the time with Redis TIME inside the script: one clock
	// for every caller, whatever their own clocks say.
	RedisTime ClockMode = iota
	// CallerClock passes Options.Clock's time to the script. Each key
	// remembers the newest time it was written at; a caller whose time lies
	// more than Options.MaxClockRegression behind it gets
	// sluice.ClockUnsafe and changes nothing.
	CallerClock
)

// String returns "redis_time" or "caller_clock".
func (m ClockMode) String() string {
	switch m {
	case RedisTime:
		return "redis_time"
	case CallerClock:
		return "caller_clock"
	}
	return fmt.Sprintf("ClockMode(%d)", uint8(m))
}

// Options configure a Store. The zero value means the defaults.
type Options struct {
	// Prefix starts every key, at most MaxPrefixLen bytes without '{' or
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
	// once. Concurrent decisions that find every sender busy go together
	// in the next pipeline, which costs Redis and the client far less than
	// one round trip each; a lone decision is sent at once, never held
	// back by a timer. Negative sends every decision alone, from its
	// caller's goroutine. Default: 2.
	Senders int
	// Lazy makes New return without contacting Redis, so an application
	// starts while Redis is down or hung: decisions fail (before send, so
	// each policy's failure mode answers) until Redis answers, and the
	// first decision to reach a node that lacks the decision code loads it
	// there; Ready reports whether Redis answers. Default: false, New
	// loads the code on every master and fails if it cannot.
	Lazy bool
	// Breaker configures the circuit breaker that sheds decisions while
	// Redis is down or hung. Default: see BreakerOptions.
	Breaker BreakerOptions
	// ClockMode is the time source. Default: RedisTime.
	ClockMode ClockMode
	// Clock is the time source in CallerClock mode; unused otherwise.
	// Default: clock.System{}.
	Clock sluice.Clock
	// MaxClockRegression is, in CallerClock mode, how far a caller's time
	// may lie behind the newest time a key was written at; further behind
	// is sluice.ClockUnsafe. Within the bound the algorithms treat the
	// earlier time as the later one. Negative means unbounded.
	// Default: 1s.
	MaxClockRegression time.Duration
	// ExtraTTL is added to every key's TTL on top of the policy's
	// CleanupGrace. TTLs run on Redis's clock; in CallerClock mode with a
	// clock that does not advance with it (a fake clock in tests), state
	// could otherwise expire in Redis while it is still live by the
	// caller's clock. Default: 0.
	ExtraTTL time.Duration
}

// rediser is the part of a go-redis client the store uses; *redis.Client
// (including Sentinel failover clients), *redis.ClusterClient and
// *redis.Ring all provide it.
type rediser interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
}

// Store is the Redis store. Create it with New; the zero value is not
// usable. Safe for concurrent use. Its sender goroutines (and, while
// Redis fails, its breaker's probe) stop on Close, which does not close
// the client: that stays the caller's.
type Store struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
	clock   sluice.Clock // nil in RedisTime mode
	maxReg  any          // ARGV_MAX_REGRESSION, a string
	extra   time.Duration
	scripts atomic.Bool // the code is loaded as a script, not a function library
	// policyArgs caches each policy's formatted arguments:
	// *sluice.Policy → *policyArgs, about cachedArgs of them.
	policyArgs sync.Map
	cachedArgs atomic.Int64
	batch      *batcher // nil: every decision is sent alone by its caller
	breaker    *breaker // nil: disabled
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store over client and loads its code on every master,
// failing if that is not possible, and starts its senders.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New: client is nil")
	}
	if opts.Prefix == "" {
		opts.Prefix = "sluice:"
	}
	if len(opts.Prefix) > MaxPrefixLen || strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: New: prefix %q: must be at most %d bytes without '{' or '}'", opts.Prefix, MaxPrefixLen)
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	if opts.ExtraTTL < 0 || opts.ExtraTTL > 24*time.Hour {
		return nil, fmt.Errorf("redisstore: New: ExtraTTL = %v: must be between 0 and 24h", opts.ExtraTTL)
	}
	s := &Store{client: client, prefix: opts.Prefix, timeout: opts.Timeout, maxReg: "-1", extra: opts.ExtraTTL}
	switch opts.ClockMode {
	case RedisTime:
	case CallerClock:
		s.clock = opts.Clock
		if s.clock == nil {
			s.clock = clock.System{}
		}
		switch {
		case opts.MaxClockRegression == 0:
			s.maxReg = strconv.FormatInt(time.Second.Microseconds(), 10)
		case opts.MaxClockRegression > 0:
			s.maxReg = strconv.FormatInt(opts.MaxClockRegression.Microseconds(), 10)
		}
	default:
		return nil, fmt.Errorf("redisstore: New: unknown clock mode %v", opts.ClockMode)
	}
	s.breaker = newBreaker(opts.Breaker, func(ctx context.Context) error {
		ctx, cancel := s.callContext(ctx)
		defer cancel()
		return client.Ping(ctx).Err()
	})
	if !opts.Lazy {
		ctx, cancel := s.callContext(context.Background())
		defer cancel()
		if err := s.load(ctx); err != nil {
			return nil, fmt.Errorf("redisstore: New: %w", err)
		}
	}
	switch {
	case opts.Senders == 0:
		s.batch = newBatcher(s, 2)
	case opts.Senders > 0:
		s.batch = newBatcher(s, opts.Senders)
	}
	return s, nil
}

// Close stops the store's sender goroutines and its breaker's probe;
// decisions asked afterwards, or still queued, fail before send. The
// client stays the caller's.
func (s *Store) Close() error {
	if s.batch != nil {
		s.batch.close()
	}
	s.breaker.close()
	return nil
}

// Ready reports whether Redis answers and holds the decision code on
// every master, loading it where it is missing. While the circuit
// breaker is open (Redis known to be failing) it says so at once,
// without waiting on Redis: readiness probes of a hung Redis then cost
// no timeout each.
func (s *Store) Ready(ctx context.Context) error {
	if s.breaker.isOpen() {
		return fmt.Errorf("redisstore: not ready: %w", errOpen)
	}
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	if err := s.load(ctx); err != nil {
		return fmt.Errorf("redisstore: not ready: %w", err)
	}
	return nil
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
	return s.policyKey(subject, p, algorithmCodes[p.Algorithm])
}

// policyKey returns the key of p for subject that ends in suffix: the
// algorithm code of its state, or one of the evaluation-id records.
func (s *Store) policyKey(subject string, p *sluice.Policy, suffix string) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + len(subject) + len(p.ID) + len(suffix) + 16)
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteString(subject)
	b.WriteByte('}')
	b.WriteString(p.ID)
	b.WriteByte(':')
	b.WriteString(strconv.FormatInt(p.Revision, 10))
	b.WriteByte(':')
	b.WriteString(suffix)
	return b.String()
}

// Evaluate implements sluice.Store.
func (s *Store) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var room [4]algorithm.Policy
	if _, err := evaluation.Check(ev, room[:0]); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	n := len(ev.Policies)
	id := ""
	if algorithm.RecordID(ev.EvaluationID, algorithm.Op(ev.Op)) != "" {
		id = ev.EvaluationID // the script derives the record id alike
	}
	var vals []int64
	var err error
	switch {
	case len(ev.Previous) == 0:
		vals, err = s.decide(ctx, ev.Subject, ev, id, "", nil)
	case ev.Op == sluice.Reset:
		for _, prev := range ev.Previous {
			if _, err := s.decide(ctx, prev, ev, "", "", nil); err != nil {
				return err
			}
		}
		vals, err = s.decide(ctx, ev.Subject, ev, id, "", nil)
	default:
		// A key rotation: decide unless a policy has no state under
		// Subject; then read the older subjects' and decide again, the
		// script keeping what it carries over.
		vals, err = s.decide(ctx, ev.Subject, ev, id, "probe", nil)
		if err == nil && len(vals) == 1 && vals[0] == replyAbsent {
			var carried []any
			if carried, err = s.previous(ctx, ev); err == nil {
				vals, err = s.decide(ctx, ev.Subject, ev, id, "carry", carried)
			}
		}
	}
	if err != nil {
		return err
	}
	if len(vals) != 1+replyPerPolicy*n {
		return fmt.Errorf("redisstore: %w: the script answered %d values for %d policies", sluice.ErrIndeterminate, len(vals), n)
	}
	ev.Replayed = vals[0] == 1
	ev.Statuses = evaluation.Statuses(ev.Statuses, n)
	for i, p := range ev.Policies {
		v := vals[1+replyPerPolicy*i:]
		d := algorithm.Decision{Allowed: v[0] == 1, Limit: v[1], Remaining: v[2], ResetAfter: v[3], RetryAfter: v[4]}
		evaluation.SetStatus(&ev.Statuses[i], p, &d)
	}
	return nil
}

// decide runs the script once for subject: ev's decision, with carry ""
// (none), "probe" or "carry" and the carried states (see redisstore.lua).
func (s *Store) decide(ctx context.Context, subject string, ev *sluice.Evaluation, id, carry string, carried []any) ([]int64, error) {
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
	for i, p := range ev.Policies {
		args[3+i] = s.key(subject, p)
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
	argv[argvCost] = intArg(ev.Cost)
	argv[argvMaxRegression] = s.maxReg
	argv[argvID] = ""
	argv[argvDedupeTTL], argv[argvDedupeMax] = "", ""
	if id != "" {
		fa := s.argsOf(first)
		argv[argvID] = id
		argv[argvDedupeTTL], argv[argvDedupeMax] = fa.dedupeTTL, fa.dedupeN
	}
	argv[argvCarry] = carry
	for i, p := range ev.Policies {
		argv[argvPolicies+i+1] = s.argsOf(p).arg
	}
	copy(argv[argvPolicies+argvPerPolicy*n+1:], carried)
	return s.send(ctx, p)
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
		_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
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
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			if err = s.classify(ctx, "read the state of an older subject", err); errors.Is(err, sluice.ErrIndeterminate) {
				// Reads only: nothing was spent, whatever happened.
				err = fmt.Errorf("redisstore: read the state of an older subject: %w: %v", sluice.FailedBeforeSend, err)
			}
			return nil, err
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

// send runs the decision p holds, through the senders or alone, and
// returns the script's reply, or the error typed by classify.
func (s *Store) send(ctx context.Context, p *pending) ([]int64, error) {
	if err := s.breaker.allow(); err != nil {
		s.release(p)
		return nil, err
	}
	return s.sendNow(ctx, p)
}

func (s *Store) sendNow(ctx context.Context, p *pending) ([]int64, error) {
	if s.batch == nil || s.batch.inflight.CompareAndSwap(0, 1) {
		// Nothing on the wire: this decision goes now, from its caller.
		if s.batch != nil {
			defer s.batch.inflight.Add(-1)
		}
		callerCtx := ctx
		defer s.release(p)
		ctx, cancel := s.callContext(ctx)
		defer cancel()
		p.cmd = newScriptCmd(ctx, p.args)
		err := s.client.Process(ctx, p.cmd)
		if notLoaded(err) {
			// The code certainly did not run: load it where the key lives
			// and try once more.
			if lerr := s.loadNode(ctx, p.args[3].(string)); lerr != nil {
				return nil, s.classify(ctx, "reload after "+err.Error(), lerr)
			}
			p.args[0], p.args[1] = s.call() // loading may have fallen back to scripts
			p.cmd = newScriptCmd(ctx, p.args)
			err = s.client.Process(ctx, p.cmd)
		}
		if err != nil && callerCtx.Err() != nil {
			// The caller's own deadline ended the wait, which says nothing
			// of Redis: not a round trip for the breaker.
			var op *net.OpError
			if !errors.As(err, &op) {
				return nil, fmt.Errorf("redisstore: run script: nothing sent: %w", callerCtx.Err())
			}
			return nil, s.classify(ctx, "run script", err)
		}
		if err != nil {
			err = s.classify(ctx, "run script", err)
		}
		s.roundTrip(err)
		if err != nil {
			return nil, err
		}
		return p.cmd.Int64Slice()
	}
	p.cmd, p.err = newScriptCmd(ctx, p.args), nil
	reuse, err := s.batch.do(ctx, p)
	if reuse {
		defer s.release(p)
	}
	if err != nil {
		return nil, err
	}
	if p.err != nil {
		return nil, p.err
	}
	return p.cmd.Int64Slice()
}

// stateReloader is a cluster client: it routes by a slot map of its own,
// which it refreshes on MOVED replies but not when a master it routes to
// is gone, so after a failover it would keep dialling the dead master for
// up to its ClusterStateReloadInterval (60s by default).
type stateReloader interface{ ReloadState(context.Context) }

// roundTrip tells the breaker how a round trip to Redis ended, and a
// cluster client whose round trip failed for want of Redis to look at the
// slot map again (at most one reload at a time, 200ms apart: go-redis
// coalesces them), so a replica promoted in the dead master's place is
// found within one reload.
func (s *Store) roundTrip(err error) {
	s.breaker.roundTrip(err)
	if r, ok := s.client.(stateReloader); ok && (errors.Is(err, sluice.FailedBeforeSend) || errors.Is(err, sluice.ErrIndeterminate)) {
		r.ReloadState(context.Background())
	}
}

// release returns p to the pool, dropping what it references.
func (s *Store) release(p *pending) {
	clear(p.args)
	p.cmd, p.err = scriptCmd{}, nil
	pendingPool.Put(p)
}

// refusedBeforeRun are error replies with which Redis refuses a script
// before it runs, or at its first write (nothing written yet: the script
// writes only after every read and check).
var refusedBeforeRun = []string{
	"NOSCRIPT", "NOPERM", "NOAUTH", "WRONGPASS", "CROSSSLOT", "CLUSTERDOWN",
	"MOVED", "ASK", "TRYAGAIN", "LOADING", "BUSY", "MASTERDOWN", "READONLY",
	"OOM", "MISCONF", "NOREPLICAS", "MAXCLIENTS",
}

// classify wraps err, from doing what, in the sentinel that types it.
func (s *Store) classify(ctx context.Context, what string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrClosed) {
		msg := rerr.Error()
		code, _, _ := strings.Cut(msg, " ")
		switch code {
		case "SLUICE_CORRUPT":
			return fmt.Errorf("redisstore: %s: %w", msg, sluice.CorruptState)
		case "SLUICE_CLOCK":
			return fmt.Errorf("redisstore: %s: %w", msg, sluice.ClockUnsafe)
		case "SLUICE_ARGS":
			return fmt.Errorf("redisstore: %s: %w", msg, sluice.ErrInvalidRequest)
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
