package redisstore

import (
	"context"
	"errors"
	"fmt"
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
	// MaxOverrides bounds the overrides the store holds: PutOverride
	// refuses to add one more (changing or removing one still works),
	// counted in Redis in the script that writes (HLEN), so stores
	// adding at once never pass it together, at the same cost whatever
	// the number. 0: no bound. Default: 0.
	MaxOverrides int
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
	// periods keeps calendar periods' bounds around this process's clock
	// (the caller's, or on Redis time the system's).
	periods      period.Cache
	onFallback   func(string)
	onSkipped    func(error) // Options.OnSkippedOverride
	maxOverrides int         // Options.MaxOverrides

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
	if opts.MaxOverrides < 0 {
		return nil, fmt.Errorf("redisstore: New: MaxOverrides = %d: must not be negative", opts.MaxOverrides)
	}
	s := &Store{client: client, prefix: opts.Prefix, timeout: opts.Timeout, maxReg: "-1", extra: opts.ExtraTTL,
		onFallback: opts.OnFallback, onSkipped: opts.OnSkippedOverride, maxOverrides: opts.MaxOverrides, breakerOpts: opts.Breaker, onChange: opts.Breaker.OnChange, state: "closed",
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

// Evaluate implements sluice.Store.
func (s *Store) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	_, err := s.evaluate(ctx, ev, false, nil)
	return err
}

// evaluate is Evaluate, and returns the time the decision was taken at on
// Redis time, as its reply says (0 on the caller's clock). all and bounds
// are for the package's tests (export_test.go), which drive through them
// what production meets only sometimes: all sends each decision in a
// decideAll call of its own, as decisions that meet busy senders go
// (batch.lua's path); bounds, when not nil, gives a calendar period's
// bounds instead of the calendar's around the store's clock (periods of a
// few ms around Redis's clock). Evaluate passes false and nil.
func (s *Store) evaluate(ctx context.Context, ev *sluice.Evaluation, all bool, bounds func(*sluice.Policy) [4]int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var room [4]algorithm.Policy
	if err := evaluation.Check(ev, room[:]); err != nil {
		return 0, fmt.Errorf("redisstore: %w", err)
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
		vals, err = s.decide(ctx, ev.Subject, ev, id, "", nil, reply[:0], all, bounds)
	case ev.Op == sluice.Reset:
		for _, prev := range ev.Previous {
			if _, err := s.decide(ctx, prev, ev, "", "", nil, reply[:0], all, bounds); err != nil {
				return 0, err
			}
		}
		vals, err = s.decide(ctx, ev.Subject, ev, id, "", nil, reply[:0], all, bounds)
	default:
		// A key rotation: decide unless a policy has no state under
		// Subject; then read the older subjects' and decide again, the
		// script keeping what it carries over.
		vals, err = s.decide(ctx, ev.Subject, ev, id, "probe", nil, reply[:0], all, bounds)
		if err == nil && len(vals) == 1 && vals[0] == replyAbsent {
			var carried []any
			if carried, err = s.previous(ctx, ev); err == nil {
				vals, err = s.decide(ctx, ev.Subject, ev, id, "carry", carried, reply[:0], all, bounds)
			}
		}
	}
	if err != nil {
		return 0, err
	}
	extra := 0 // a settle's charged, given back and owed of each policy follow the decisions, a book's delay its one
	switch ev.Op {
	case sluice.Settle:
		extra = 3 * n
	case sluice.Book:
		extra = 1
	}
	var at int64
	switch {
	case len(vals) == 2+replyPerPolicy*n+extra && s.clock == nil:
		at = vals[len(vals)-1] // on Redis time the reply ends with the time it decided at
	case len(vals) != 1+replyPerPolicy*n+extra || s.clock == nil:
		return 0, fmt.Errorf("redisstore: %w: the script answered %d values for %d policies", sluice.ErrIndeterminate, len(vals), n)
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
	return at, nil
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
// all and bounds are evaluate's.
func (s *Store) decide(ctx context.Context, subject string, ev *sluice.Evaluation, id, carry string, carried []any, dst []int64, all bool, bounds func(*sluice.Policy) [4]int64) ([]int64, error) {
	if evaluation.Short(ev) {
		return s.decideShort(ctx, subject, ev, dst, all, bounds)
	}
	return s.send(ctx, s.generalPending(subject, ev, id, carry, carried, bounds), ev, dst, all)
}

// generalPending returns the pending decision that decide sends for a
// decision in the general form: ev's for subject, with id, carry and
// carried (and bounds) as decide's.
func (s *Store) generalPending(subject string, ev *sluice.Evaluation, id, carry string, carried []any, bounds func(*sluice.Policy) [4]int64) *pending {
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
		fa := s.argsOf(first, 0, bounds) // its dedupe numbers
		argv[argvID] = id
		argv[argvDedupeTTL], argv[argvDedupeMax] = fa.dedupeTTL, fa.dedupeN
	}
	argv[argvCarry] = carry
	op := evaluation.Op(ev)
	for i, p := range ev.Policies {
		argv[argvPolicies+i+1] = s.argsOf(p, evaluation.Reserve(p, ev.Priority, op), bounds).arg
	}
	copy(argv[argvPolicies+argvPerPolicy*n+1:], carried)
	return p
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
