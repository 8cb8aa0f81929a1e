package redisstore

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/evaluation"
)

// The decision code, one Lua file per Go file it ports, joined in this
// order (each defines what the later ones use).
//
//go:embed lua/*.lua
var luaFiles embed.FS

var scriptFiles = []string{
	"params.lua",         // internal/engine/algorithm/params.go
	"codec.lua",          // error replies and integer strings
	"fixed_window.lua",   // internal/engine/algorithm/fixed_window.go
	"sliding_log.lua",    // internal/engine/algorithm/sliding_log.go
	"sliding_window.lua", // internal/engine/algorithm/sliding_window.go
	"token_bucket.lua",   // internal/engine/algorithm/token_bucket.go
	"gcra.lua",           // internal/engine/algorithm/gcra.go
	"concurrency.lua",    // internal/engine/algorithm/concurrency.go
	"engine.lua",         // internal/engine/algorithm/engine.go
	"redisstore.lua",     // Evaluate's part in Redis: keys, ARGV, writes, ids
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

// load loads the code on every master (every shard of a Ring).
func (s *Store) load(ctx context.Context) error {
	loadOn := func(ctx context.Context, c *redis.Client) error { return s.loadOn(ctx, c) }
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, loadOn)
	case *redis.Ring:
		return c.ForEachShard(ctx, loadOn)
	default:
		return s.loadOn(ctx, c)
	}
}

// loadNode loads the code on the node that owns key, after the node
// answered that it does not hold it.
func (s *Store) loadNode(ctx context.Context, key string) error {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		return s.loadOn(ctx, node)
	case *redis.Ring:
		return s.load(ctx)
	default:
		return s.loadOn(ctx, c)
	}
}

// loadOn loads the code on one node: as a function library unless the
// store already fell back to scripts, falling back for good when the node
// does not know FUNCTION (before Redis 7) or the user may not run it.
func (s *Store) loadOn(ctx context.Context, c rediser) error {
	if !s.scripts.Load() {
		cmd := redis.NewStringCmd(ctx, "function", "load", librarySource)
		err := c.Process(ctx, cmd)
		msg := replyError(err)
		switch {
		case err == nil, strings.HasPrefix(msg, "ERR Library") && strings.Contains(msg, "already exists"):
			return nil
		case strings.HasPrefix(msg, "NOPERM"), strings.HasPrefix(msg, "ERR unknown command"):
			s.scripts.Store(true)
		default:
			return fmt.Errorf("function load: %w", err)
		}
	}
	sha, err := c.ScriptLoad(ctx, scriptSource).Result()
	if err != nil {
		return fmt.Errorf("script load: %w", err)
	}
	if sha != scriptSHA {
		return fmt.Errorf("script load: redis answered sha1 %s, want %s", sha, scriptSHA)
	}
	return nil
}

// notLoaded reports whether err says the node does not hold the code, or
// cannot run it as a function (a Lazy store has not learnt yet that the
// node predates Redis 7 or that the user may not FCALL), so the call
// certainly did not run.
func notLoaded(err error) bool {
	msg := replyError(err)
	return strings.HasPrefix(msg, "NOSCRIPT") || strings.HasPrefix(msg, "ERR Function not found") ||
		strings.HasPrefix(msg, "ERR unknown command 'fcall'") || strings.HasPrefix(msg, "ERR unknown command `fcall`") ||
		strings.HasPrefix(msg, "NOPERM") && strings.Contains(msg, "'fcall'")
}

// replyError returns the error reply err carries, "" when it is none.
func replyError(err error) string {
	if err == nil {
		return ""
	}
	var re redis.Error
	if errors.As(err, &re) {
		return re.Error()
	}
	return ""
}

// policyArgs are a policy's arguments to the decision code, formatted once
// and held as interface values: a decision copies them without allocating.
type policyArgs struct {
	policy             sluice.Policy // the numbers they were formatted from
	arg                any           // the policy's argument: "kind limit window burst grace"
	dedupeTTL, dedupeN any
}

// argsOf returns p's arguments, formatting them the first time p (the
// Limiter's own copy of a policy, which does not change) is seen, and again
// should its numbers differ from what they were formatted from.
func (s *Store) argsOf(p *sluice.Policy) *policyArgs {
	if v, ok := s.policyArgs.Load(p); ok {
		if a := v.(*policyArgs); a.policy == *p {
			return a
		}
	}
	a := &policyArgs{policy: *p}
	a.arg = fmt.Sprintf("%d %d %d %d %d", p.Algorithm, p.Limit, evaluation.Window(p), p.Burst, (p.CleanupGrace + s.extra).Microseconds())
	a.dedupeTTL = strconv.FormatInt(p.DedupeTTL.Microseconds(), 10)
	a.dedupeN = strconv.Itoa(p.DedupeMax)
	if s.cachedArgs.Add(1) > maxCachedArgs {
		// Policies built afresh for every decision (a caller of Evaluate
		// that is not a Limiter) must not grow the cache without bound.
		s.policyArgs.Clear()
		s.cachedArgs.Store(1)
	}
	s.policyArgs.Store(p, a)
	return a
}

// maxCachedArgs bounds the policies whose arguments a Store keeps.
const maxCachedArgs = 4096

// smallInts holds "0" to "255" as interface values, for the counts and
// costs most decisions send.
var smallInts = func() (v [256]any) {
	for i := range v {
		v[i] = strconv.Itoa(i)
	}
	return v
}()

// intArg returns n as an argument, without allocating for 0 to 255.
func intArg(n int64) any {
	if n >= 0 && n < int64(len(smallInts)) {
		return smallInts[n]
	}
	return strconv.FormatInt(n, 10)
}
