package redisstore

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/redisreply"
)

// The decision code, one Lua file per Go file it ports, joined in this
// order (each defines what the later ones use).
//
//go:embed lua/*.lua
var luaFiles embed.FS

var scriptFiles = []string{
	"params.lua",         // internal/engine/algorithm/params.go
	"codec.lua",          // codec.go: error replies, integer strings
	"fixed_window.lua",   // internal/engine/algorithm/fixed_window.go
	"fixed_period.lua",   // internal/engine/algorithm/fixed_period.go
	"sliding_log.lua",    // internal/engine/algorithm/sliding_log.go
	"sliding_window.lua", // internal/engine/algorithm/sliding_window.go
	"token_bucket.lua",   // internal/engine/algorithm/token_bucket.go
	"gcra.lua",           // internal/engine/algorithm/gcra.go
	"concurrency.lua",    // internal/engine/algorithm/concurrency.go
	"engine.lua",         // internal/engine/algorithm/engine.go
	"args.lua",           // redisstore.go's arguments, read and checked
	"records.lua",        // keys into the engine's states, writes and TTLs
	"dedupe.lua",         // internal/engine/algorithm/dedupe.go
	"settle.lua",         // internal/engine/algorithm/settle.go
	"carry.lua",          // internal/engine/algorithm/carry.go
	"short.lua",          // internal/engine/algorithm/one.go
	"redisstore.lua",     // Evaluate's part in Redis: the entry points
	"batch.lua",          // batch.go: several decisions in one call
}

// decideLua is the joined code: it defines decide(keys, args) and runs
// nothing.
var decideLua = func() string {
	var b strings.Builder
	for _, name := range scriptFiles {
		src, err := luaFiles.ReadFile("lua/" + name)
		if err != nil {
			panic(err) // embedded at build time: cannot happen
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String()
}()

// codeName names this version of the code in Redis: the library and its
// function are "sluice_" and the first 16 hex digits of the code's SHA-1,
// so stores of two versions of sluice (a rolling deploy) share one Redis
// without replacing each other's code.
var codeName = func() string {
	h := sha1.Sum([]byte(decideLua))
	return "sluice_" + hex.EncodeToString(h[:8])
}()

// The two forms the code is loaded in. On Redis 7 and later it is a
// function library: FUNCTION LOAD runs the definitions once and each
// decision is one FCALL of the registered function, which costs Redis far
// less than a script that rebuilds every definition on each call; the
// library also registers codeName_all, several decisions in one call
// (decideAll). Before Redis 7, or for a user not allowed FUNCTION LOAD,
// it is a script: SCRIPT LOAD once, one EVALSHA per decision. Both take
// KEYS and ARGV alike.
var (
	librarySource = "#!lua name=" + codeName + "\n" + decideLua +
		"redis.register_function('" + codeName + "', decide)\n" +
		"redis.register_function('" + codeName + "_all', decideAll)\n"
	scriptSource = decideLua + "return decide(KEYS, ARGV)\n"
	scriptSHA    = func() string {
		h := sha1.Sum([]byte(scriptSource))
		return hex.EncodeToString(h[:])
	}()
)

// The command name and the function name or script SHA of a decision,
// held as interface values so that putting them in a command's arguments
// does not allocate.
var (
	callFunction = [2]any{"fcall", codeName}
	callScript   = [2]any{"evalsha", scriptSHA}
	callAll      = [2]any{"fcall", codeName + "_all"}
)

// call returns the command name and the function name or script SHA of a
// decision.
func (s *Store) call() (any, any) {
	c := &callFunction
	if s.scripts.Load() {
		c = &callScript
	}
	return c[0], c[1]
}

// mark stands in a decision's command for its last argument (a policy's
// or a carried state's, always a string) and notes when go-redis writes
// the command: go-redis asks an argument for its bytes (MarshalBinary)
// only when it writes the command into a connection that is up, after
// waiting for the connection, dialling it and setting it up. Whether a
// command that got no reply was written tells a decision that may have
// run (Indeterminate) from one that cannot have (failed before send):
// go-redis returns the same context error for both. A decideAll call
// holds the marks of its decisions. The last argument is the one hooks
// (tracing) are least likely to read by type; they print it alike
// (String).
type mark struct {
	arg     string
	src     []byte // or, when not nil, the argument's bytes, which the pooled decision keeps (a decision's key)
	buf     []byte // arg's bytes, in a buffer the pooled decision keeps
	written atomic.Bool
}

// MarshalBinary implements encoding.BinaryMarshaler.
func (m *mark) MarshalBinary() ([]byte, error) {
	m.written.Store(true)
	if m.src != nil {
		return m.src, nil
	}
	m.buf = append(m.buf[:0], m.arg...)
	return m.buf, nil
}

// String returns the argument, for logs and traces of the command.
func (m *mark) String() string {
	if m.src != nil {
		return string(m.src)
	}
	return m.arg
}

// arm puts m in args (a decision's command) in place of its last
// argument, not yet written.
func (m *mark) arm(args []any) {
	last := len(args) - 1
	switch v := args[last].(type) {
	case *mark:
		m.arg = v.arg // m itself, re-armed for a retry
	case string:
		m.arg = v
	default:
		m.arg = fmt.Sprint(v)
	}
	m.written.Store(false)
	args[last] = m
}

// text is a string argument a pooled decision holds: put in its command
// as a pointer, it costs no allocation, where a string would cost one.
type text struct {
	s   string
	buf []byte // s's bytes, in a buffer the pooled decision keeps
}

// MarshalBinary implements encoding.BinaryMarshaler.
func (t *text) MarshalBinary() ([]byte, error) {
	t.buf = append(t.buf[:0], t.s...)
	return t.buf, nil
}

// String returns the argument, for logs and traces of the command.
func (t *text) String() string { return t.s }

// keyArg is a decision's first key, written into a buffer the pooled
// decision keeps: put in its command as a pointer, it costs no
// allocation, where a string would cost one per decision.
type keyArg struct{ b []byte }

// MarshalBinary implements encoding.BinaryMarshaler.
func (k *keyArg) MarshalBinary() ([]byte, error) { return k.b, nil }

// String returns the key, for logs and traces of the command, and for
// go-redis's Cluster routing.
func (k *keyArg) String() string { return string(k.b) }

// load loads the code on every master of a Cluster, every shard of a
// Ring, or the one Redis.
func (s *Store) load(ctx context.Context) error {
	loadOn := func(ctx context.Context, c *redis.Client) error { return s.loadOn(ctx, c) }
	switch {
	case s.cluster != nil:
		return s.cluster.ForEachMaster(ctx, loadOn)
	case s.ring != nil:
		return s.ring.ForEachShard(ctx, loadOn)
	}
	return s.loadOn(ctx, s.client)
}

// loadNode loads the code on n, after Redis answered cause to one of its
// decisions: that it does not hold the code, or may not or cannot run
// FCALL, in which case the store falls back to scripts for good.
func (s *Store) loadNode(ctx context.Context, n *node, key []byte, cause error) error {
	if msg := redisreply.Error(cause); redisreply.NoFunctions(msg) {
		s.fallBack("redis refused FCALL: " + msg)
	}
	switch {
	case s.ring != nil:
		return s.load(ctx)
	case s.cluster != nil && n.client.Load() == nil:
		c, err := s.cluster.MasterForKey(ctx, string(key))
		if err != nil {
			return err
		}
		return s.loadOn(ctx, c)
	}
	return s.loadOn(ctx, s.direct(n))
}

// fallBack makes the store send scripts from now on, and says why once.
func (s *Store) fallBack(reason string) {
	if s.scripts.CompareAndSwap(false, true) && s.onFallback != nil {
		s.onFallback(reason + "; deciding with scripts (SCRIPT LOAD, EVALSHA) from now on")
	}
}

// loadOn loads the code on one node: as a function library unless the
// store already fell back to scripts, falling back for good when the node
// does not know FUNCTION (before Redis 7) or the user may not run it.
func (s *Store) loadOn(ctx context.Context, c processor) error {
	if !s.scripts.Load() {
		cmd := redis.NewStringCmd(ctx, "function", "load", librarySource)
		err := c.Process(ctx, onceCmd{cmd})
		msg := redisreply.Error(err)
		switch {
		case err == nil, strings.HasPrefix(msg, "ERR Library") && strings.Contains(msg, "already exists"):
			return nil
		case strings.HasPrefix(msg, "NOPERM"), strings.HasPrefix(msg, "ERR unknown command"):
			s.fallBack("redis refused FUNCTION LOAD: " + msg)
		default:
			return fmt.Errorf("function load: %w", err)
		}
	}
	cmd := redis.NewStringCmd(ctx, "script", "load", scriptSource)
	if err := c.Process(ctx, onceCmd{cmd}); err != nil {
		return fmt.Errorf("script load: %w", err)
	}
	if sha := cmd.Val(); sha != scriptSHA {
		return fmt.Errorf("script load: redis answered sha1 %s, want %s", sha, scriptSHA)
	}
	return nil
}

// onceCmd is a command of the store's own that go-redis must not retry:
// the store knows better what to do when it fails (a READONLY replica,
// which go-redis retries for up to a second, is a failure to report now).
type onceCmd struct{ redis.Cmder }

// NoRetry implements redis.Cmder.
func (onceCmd) NoRetry() bool { return true }

// processor sends one command.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// policyArgs are a policy's arguments to the decision code, formatted once
// and held as interface values: a decision copies them without allocating.
type policyArgs struct {
	numbers            argNumbers // the numbers they were formatted from
	arg                any        // the policy's argument: "kind limit window burst grace align", " r<reserve>" after it for a class's
	text               string     // arg, as a string
	spend1             string     // the spec of a spend of 1 under it on Redis time (shortSpec)
	leases             [2]string  // a concurrency policy's: the specs of an acquire and of a release under it on Redis time
	limit              int64      // the limit its decisions answer: the burst of a bucket, else the limit
	bounds             [4]int64   // a calendar period's bounds in arg (algorithm.Params.Bounds); zero for others
	dedupeTTL, dedupeN any
}

// argNumbers are the fields of a policy its arguments are formatted
// from, and the reserve of a priority class (algorithm.Params.Reserve).
type argNumbers struct {
	algorithm                          sluice.Algorithm
	limit, burst, reserve              int64
	window, leaseTTL, grace, dedupeTTL time.Duration
	dedupeMax                          int
	aligned                            bool
	period                             string
	zone                               *time.Location
}

// classArgs keys the arguments of a policy for a priority class that
// holds part of its capacity back (reserve > 0); the policy alone keys
// the others.
type classArgs struct {
	p       *sluice.Policy
	reserve int64
}

// argsOf returns p's arguments for a decision that holds reserve units
// of its capacity back (a priority class's: evaluation.Reserve),
// formatting them the first time p (the Limiter's own copy of a policy,
// which does not change) is seen with that reserve, and again should its
// numbers differ from what they were formatted from. A few classes make
// a few entries, each its own argument string (args.lua caches by it).
// A calendar period's bounds are set's, when not nil (evaluate's bounds).
func (s *Store) argsOf(p *sluice.Policy, reserve int64, set func(*sluice.Policy) [4]int64) *policyArgs {
	var bounds [4]int64
	switch {
	case p.Period == "":
	case set != nil:
		bounds = set(p)
	default:
		bounds = s.boundsOf(p)
	}
	var key any = p
	if reserve != 0 {
		key = classArgs{p, reserve}
	}
	nums := argNumbers{p.Algorithm, p.Limit, p.Burst, reserve, p.Window, p.LeaseTTL, p.CleanupGrace, p.DedupeTTL, p.DedupeMax, p.ClockAligned, p.Period, p.TimeZone}
	if v, ok := s.policyArgs.Load(key); ok {
		if a := v.(*policyArgs); a.numbers == nums && a.bounds == bounds {
			return a
		}
	}
	a := &policyArgs{numbers: nums, bounds: bounds}
	align := 0
	if p.ClockAligned {
		align = 1
	}
	kind := algorithm.Kind(p.Algorithm)
	if kind == algorithm.KindFixedWindow && s.clock == nil {
		kind = algorithm.KindFixedWindowEnd // on Redis time: the count and the window's end
	}
	a.text = fmt.Sprintf("%d %d %d %d %d %d", kind, p.Limit, evaluation.Window(p), p.Burst, (p.CleanupGrace + s.extra).Microseconds(), align)
	if p.Period != "" {
		// A calendar period: its length now and the bounds of its periods
		// around this process's clock, for the script to pick from.
		a.text = fmt.Sprintf("%d %d %d %d %d %d %d %d %d %d", algorithm.KindFixedPeriod, p.Limit, bounds[2]-bounds[1], p.Burst,
			(p.CleanupGrace + s.extra).Microseconds(), align, bounds[0], bounds[1], bounds[2], bounds[3])
	}
	if reserve != 0 {
		a.text += " r" + strconv.FormatInt(reserve, 10) // args.lua's parsePolicy reads it
	}
	a.arg, a.spend1, a.limit = a.text, "s 1 0 "+a.text, p.Limit
	if p.Algorithm == sluice.Concurrency {
		a.leases = [2]string{"a 0 0 " + a.text, "r 0 0 " + a.text}
	}
	if p.Algorithm == sluice.GCRA || p.Algorithm == sluice.TokenBucket {
		a.limit = p.Burst
	}
	a.dedupeTTL = strconv.FormatInt(p.DedupeTTL.Microseconds(), 10)
	a.dedupeN = strconv.Itoa(p.DedupeMax)
	if s.cachedArgs.Add(1) > maxCachedArgs {
		// Policies built afresh for every decision (a caller of Evaluate
		// that is not a Limiter) must not grow the cache without bound.
		s.policyArgs.Clear()
		s.cachedArgs.Store(1)
	}
	s.policyArgs.Store(key, a)
	return a
}

// boundsOf returns the periods of p, a policy with a calendar period,
// around this process's clock: the caller's (Options.Clock), or on Redis
// time the system's, which the script holds Redis's to.
func (s *Store) boundsOf(p *sluice.Policy) [4]int64 {
	var c sluice.Clock = clock.System{}
	if s.clock != nil {
		c = s.clock
	}
	return evaluation.Bounds(p, evaluation.Now(c), &s.periods)
}

// maxCachedArgs bounds the policies whose arguments a Store keeps.
const maxCachedArgs = 4096
