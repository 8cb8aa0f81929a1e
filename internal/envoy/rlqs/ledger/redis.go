package ledger

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redisreply"
)

// code is the ledger's Lua: claim.lua ports claim and Memory, function by
// function; it defines ledger(keys, args) and runs nothing.
//
//go:embed claim.lua
var code string

// The two forms the code is loaded in, as redisstore loads its own: on
// Redis 7 and later a function library of its own, named by the code's
// hash so two versions of sluice share one Redis, called with FCALL;
// before Redis 7, or for a user not allowed FUNCTION, a script loaded with
// SCRIPT LOAD and called with EVALSHA. Never EVAL.
var (
	codeName = func() string {
		h := sha1.Sum([]byte(code))
		return "sluice_rlqs_" + hex.EncodeToString(h[:8])
	}()
	librarySource = "#!lua name=" + codeName + "\n" + code + "redis.register_function('" + codeName + "', ledger)\n"
	scriptSource  = code + "return ledger(KEYS, ARGV)\n"
	scriptSHA     = func() string {
		h := sha1.Sum([]byte(scriptSource))
		return hex.EncodeToString(h[:])
	}()
)

// The bounds of what a claim carries: claim.lua computes on doubles,
// exact below 2^53.
const (
	maxAmount   = 1<<53 - 1
	maxInstance = 255
	maxTTL      = 24 * time.Hour
	argsPer     = 2 // claim.lua's values per claim: the bucket and its packed amounts
	replyPer    = 6 // claim.lua's values per grant
)

// Redis is the ledger of every instance sharing one Redis, Sentinel
// deployment or Cluster: one hash per domain, one Lua call per Claim or
// Release, on Redis time. Safe for concurrent use; the client stays the
// caller's.
type Redis struct {
	c      redis.UniversalClient
	prefix string
	// scripts is set once Redis refused functions: EVALSHA from then on.
	scripts atomic.Bool
}

var _ Ledger = (*Redis)(nil)

// NewRedis returns the ledger kept in the Redis c reaches: a client,
// a Sentinel failover client or a Cluster client. prefix starts every key,
// as redisstore.Options.Prefix starts the store's: give it the same one,
// so that one ACL key pattern covers both. "" is redisstore's default,
// "sluice:"; like redisstore's, it is at most 64 bytes without '{' or '}'
// (a brace would change the key's Cluster slot). The code is loaded on
// first use, and again wherever Redis answers that it lacks it (a restart,
// a failover to a node without it).
func NewRedis(c redis.UniversalClient, prefix string) (*Redis, error) {
	if prefix == "" {
		prefix = defaultPrefix
	}
	if len(prefix) > maxPrefix || strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("rlqs ledger: prefix %q: must be at most %d bytes without '{' or '}'", prefix, maxPrefix)
	}
	return &Redis{c: c, prefix: prefix}, nil
}

// redisstore's default key prefix and the bound of one (redisstore.go;
// this package does not import the store).
const (
	defaultPrefix = "sluice:"
	maxPrefix     = 64
)

// key returns the hash that holds domain's buckets under prefix: one per
// domain, in one Cluster slot by its hash tag; the domain itself never
// reaches Redis.
func key(prefix, domain string) string {
	h := sha256.Sum256([]byte(domain))
	return prefix + "rlqs:{" + hex.EncodeToString(h[:8]) + "}"
}

// Claim implements Ledger.
func (r *Redis) Claim(ctx context.Context, domain, instance string, cs []Claim, ttl time.Duration) ([]Grant, error) {
	gs, _, err := r.claim(ctx, domain, instance, cs, ttl)
	return gs, err
}

// claim is Claim, returning also the time on Redis the code saw (µs).
func (r *Redis) claim(ctx context.Context, domain, instance string, cs []Claim, ttl time.Duration) ([]Grant, int64, error) {
	args, err := claimArgs(instance, cs, ttl)
	if err != nil {
		return nil, 0, fmt.Errorf("rlqs ledger: claim: %w", err)
	}
	vals, err := r.run(ctx, key(r.prefix, domain), args)
	if err != nil {
		return nil, 0, fmt.Errorf("rlqs ledger: claim: %w", err)
	}
	gs, now, err := parseGrants(vals, len(cs))
	if err != nil {
		return nil, 0, fmt.Errorf("rlqs ledger: claim: %w", err)
	}
	return gs, now, nil
}

// Release implements Ledger.
func (r *Redis) Release(ctx context.Context, domain, instance string) error {
	if err := checkInstance(instance); err != nil {
		return fmt.Errorf("rlqs ledger: release: %w", err)
	}
	if _, err := r.run(ctx, key(r.prefix, domain), []any{"release", instance}); err != nil {
		return fmt.Errorf("rlqs ledger: release: %w", err)
	}
	return nil
}

func checkInstance(instance string) error {
	if instance == "" || len(instance) > maxInstance {
		return fmt.Errorf("instance of %d bytes: must be 1 to %d bytes", len(instance), maxInstance)
	}
	if strings.IndexByte(instance, 0) >= 0 {
		return errors.New("instance: holds a NUL byte: claim.lua stores it zero-terminated")
	}
	return nil
}

// claimArgs returns the code's arguments for cs, checked: at most
// MaxClaims, every amount in [0, 2^53), no bucket empty (the hash's field
// "" is the code's own). Each claim's amounts go as 8 little-endian
// doubles (exact below 2^53), which the code reads without parsing text.
func claimArgs(instance string, cs []Claim, ttl time.Duration) ([]any, error) {
	if err := checkInstance(instance); err != nil {
		return nil, err
	}
	if len(cs) > MaxClaims {
		return nil, fmt.Errorf("%d claims: at most %d a call", len(cs), MaxClaims)
	}
	if ttl < time.Millisecond || ttl > maxTTL {
		return nil, fmt.Errorf("ttl %v: must be between 1ms and %v", ttl, maxTTL)
	}
	args := make([]any, 0, 3+argsPer*len(cs))
	args = append(args, "claim", instance, ttl.Microseconds())
	for i, c := range cs {
		if c.Bucket == "" {
			return nil, fmt.Errorf("claims[%d].Bucket: empty: a bucket's subject is never empty", i)
		}
		nums := [...]int64{c.Rate, c.Burst, c.Demand, c.Streams, c.Wish, c.WishBurst, c.Committed, c.CommittedBurst}
		for j, n := range nums {
			if n < 0 || n > maxAmount {
				return nil, fmt.Errorf("claims[%d].%s = %d: must be between 0 and 2^53-1", i, claimFields[j], n)
			}
		}
		packed := make([]byte, 0, 8*len(nums))
		for _, n := range nums {
			packed = binary.LittleEndian.AppendUint64(packed, math.Float64bits(float64(n)))
		}
		args = append(args, c.Bucket, packed)
	}
	return args, nil
}

var claimFields = [...]string{"Rate", "Burst", "Demand", "Streams", "Wish", "WishBurst", "Committed", "CommittedBurst"}

// parseGrants reads the code's reply to n claims: the time, then six
// integers per grant.
func parseGrants(v any, n int) ([]Grant, int64, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) != 1+replyPer*n {
		return nil, 0, fmt.Errorf("reply %s: want an array of %d integers", describe(v), 1+replyPer*n)
	}
	ints := make([]int64, len(vals))
	for i, x := range vals {
		if ints[i], ok = x.(int64); !ok {
			return nil, 0, fmt.Errorf("reply value %d is %T: want an integer", i, x)
		}
	}
	gs := make([]Grant, n)
	for i := range gs {
		g := ints[1+replyPer*i:]
		gs[i] = Grant{Rate: g[0], Burst: g[1], Reserved: g[2], ReservedBurst: g[3], Demand: g[4], Streams: g[5]}
	}
	return gs, ints[0], nil
}

// describe names a reply's shape, never its contents.
func describe(v any) string {
	if vals, ok := v.([]any); ok {
		return "of " + strconv.Itoa(len(vals)) + " values"
	}
	return fmt.Sprintf("of type %T", v)
}

// run calls the code on key with args: FCALL, or EVALSHA once Redis
// refused functions. When Redis answers that it lacks the code (a first
// call, a restart, a failover, a FLUSH), the call certainly did not run:
// the code is loaded where key lives and the call sent once more.
func (r *Redis) run(ctx context.Context, key string, args []any) (any, error) {
	v, err := r.c.Do(ctx, r.command(key, args)...).Result()
	if redisreply.NotLoaded(err) {
		if lerr := r.load(ctx, key, err); lerr != nil {
			return nil, fmt.Errorf("load the code after %q: %w", redisreply.Error(err), lerr)
		}
		v, err = r.c.Do(ctx, r.command(key, args)...).Result()
	}
	return v, err
}

// command returns the call of the code on key with args.
func (r *Redis) command(key string, args []any) []any {
	cmd := make([]any, 0, 4+len(args))
	if r.scripts.Load() {
		cmd = append(cmd, "evalsha", scriptSHA)
	} else {
		cmd = append(cmd, "fcall", codeName)
	}
	return append(append(cmd, 1, key), args...)
}

// load loads the code on the node that holds key (every shard of a
// Ring), after Redis answered cause; when cause says Redis will not run
// functions for this user, the ledger sends scripts from now on.
func (r *Redis) load(ctx context.Context, key string, cause error) error {
	if redisreply.NoFunctions(redisreply.Error(cause)) {
		r.scripts.Store(true)
	}
	switch c := r.c.(type) {
	case interface {
		MasterForKey(context.Context, string) (*redis.Client, error)
	}:
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		return r.loadOn(ctx, m)
	case interface {
		ForEachShard(context.Context, func(context.Context, *redis.Client) error) error
	}:
		return c.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error { return r.loadOn(ctx, s) })
	}
	return r.loadOn(ctx, r.c)
}

// loadOn loads the code on one node: as a function library unless the
// ledger sends scripts, falling back to scripts for good when the node
// does not know FUNCTION (before Redis 7) or the user may not run it.
func (r *Redis) loadOn(ctx context.Context, c redis.Cmdable) error {
	if !r.scripts.Load() {
		err := c.FunctionLoad(ctx, librarySource).Err()
		msg := redisreply.Error(err)
		switch {
		case err == nil, strings.HasPrefix(msg, "ERR Library") && strings.Contains(msg, "already exists"):
			return nil
		case strings.HasPrefix(msg, "NOPERM"), strings.HasPrefix(msg, "ERR unknown command"):
			r.scripts.Store(true)
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
