package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/overridemap"
	"github.com/sluicehq/sluice/internal/redisreply"
)

// The methods a Limiter looks for to keep overrides in its Store (see
// sluice.Limiter.SetOverride).
var _ interface {
	PutOverride(context.Context, sluice.Override) error
	Overrides(context.Context) ([]sluice.Override, error)
} = (*Store)(nil)

// Overrides live in one hash, <Prefix>{overrides}, one field per
// override: the policy ID, a 0 byte and the subject (a pseudonym at the
// server), its value "1|<limit>|<burst>|<window µs>|<note>". Every change
// INCRs <Prefix>{overrides}:version, so a reader that has the list reads
// only the version (one GET) until it moves. The hash tag keeps both in
// one slot of a Cluster. A put is one EVALSHA of putScript (HLEN, HGET,
// HSET and INCR inside, whatever the number of overrides); a removal
// HDEL and INCR; a read GET, and HGETALL when the version moved.
const (
	overridesKey = "{overrides}"
	versionKey   = "{overrides}:version"
)

// putScript stores one override unless that would make the hash hold
// more than its most: KEYS[1] the hash, KEYS[2] the version; ARGV[1] the
// field, ARGV[2] the value, ARGV[3] the most fields (0: no bound, and no
// HLEN). It answers -1 once it has written (HSET, then INCR), or the
// number of fields when the field is new and the hash holds the most
// already (nothing written). In one script, the count and the write are
// one step: servers adding at once never pass the bound together.
const putScript = `local max = tonumber(ARGV[3])
if max > 0 then
  local n = redis.call('HLEN', KEYS[1])
  if n >= max and not redis.call('HGET', KEYS[1], ARGV[1]) then
    return n
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('INCR', KEYS[2])
return -1
`

// putScriptSHA is putScript's SHA-1, which EVALSHA names it by.
var putScriptSHA = func() string {
	h := sha1.Sum([]byte(putScript))
	return hex.EncodeToString(h[:])
}()

// overrideCache is the list as last read and the version it was read at.
type overrideCache struct {
	version string
	list    []sluice.Override
}

// PutOverride keeps overrides for sluice.Limiter: it stores o in Redis (or,
// with o.Limit 0, removes it) and moves the version every reader polls.
// Past Options.MaxOverrides, a new override is refused, nothing written.
// sluice.Limiter.SetOverride validates o first.
func (s *Store) PutOverride(ctx context.Context, o sluice.Override) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if strings.IndexByte(o.Policy, 0) >= 0 || strings.IndexByte(o.Subject, 0) >= 0 {
		return fmt.Errorf("redisstore: PutOverride: %w: policy and subject must not hold a 0 byte", sluice.ErrInvalidRequest)
	}
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	field := o.Policy + "\x00" + o.Subject
	if o.Limit != 0 {
		value := fmt.Sprintf("1|%d|%d|%d|%s", o.Limit, o.Burst, o.Window.Microseconds(), o.Note)
		return s.putOverride(ctx, field, value)
	}
	pipe := s.client.Pipeline()
	pipe.HDel(ctx, s.prefix+overridesKey, field)
	pipe.Incr(ctx, s.prefix+versionKey)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redisstore: PutOverride: %w", err)
	}
	return nil
}

// putOverride runs putScript for field and value, loading it first on
// the Redis that holds the hash when that Redis does not have it.
func (s *Store) putOverride(ctx context.Context, field, value string) error {
	keys := []string{s.prefix + overridesKey, s.prefix + versionKey}
	run := func() (int64, error) {
		cmd := redis.NewIntCmd(ctx, "evalsha", putScriptSHA, 2, keys[0], keys[1], field, value, s.maxOverrides)
		err := s.client.Process(ctx, cmd)
		return cmd.Val(), err
	}
	n, err := run()
	if err != nil && strings.HasPrefix(redisreply.Error(err), "NOSCRIPT") {
		if err = s.loadPutScript(ctx, keys[0]); err == nil {
			n, err = run()
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: PutOverride: %w", err)
	case n >= 0:
		return fmt.Errorf("redisstore: PutOverride: %w", &overridemap.Full{Stored: int(n), Max: s.maxOverrides})
	}
	return nil
}

// loadPutScript loads putScript on the Redis that holds key (every shard
// of a Ring: it says which holds a key by its own hash).
func (s *Store) loadPutScript(ctx context.Context, key string) error {
	load := func(ctx context.Context, c *redis.Client) error {
		return c.Process(ctx, redis.NewStringCmd(ctx, "script", "load", putScript))
	}
	switch {
	case s.cluster != nil:
		c, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		return load(ctx, c)
	case s.ring != nil:
		return s.ring.ForEachShard(ctx, load)
	}
	return s.client.Process(ctx, redis.NewStringCmd(ctx, "script", "load", putScript))
}

// Overrides keeps overrides for sluice.Limiter: one GET of the version,
// and the whole hash only when the version moved since the last read. A
// field this store cannot read is skipped and reported to
// Options.OnSkippedOverride; the others are returned. The read goes
// through the breaker of the Redis that holds the overrides, as a
// decision does: shed at once while it is open (a Limiter whose overrides
// are stale waits for this read before it decides), and a read that
// fails for want of Redis counts towards opening it.
func (s *Store) Overrides(ctx context.Context) ([]sluice.Override, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := s.nodeFor(ctx, []byte(s.prefix+overridesKey))
	if err := n.breaker.allow(); err != nil {
		return nil, err
	}
	callCtx, cancel := s.callContext(ctx)
	defer cancel()
	list, err := s.readOverrides(callCtx)
	s.record(ctx, n, err)
	return list, err
}

// readOverrides is Overrides' round trips.
func (s *Store) readOverrides(ctx context.Context) ([]sluice.Override, error) {
	version, err := s.overrideVersion(ctx)
	if err != nil {
		return nil, err
	}
	if c := s.ovrCache.Load(); c != nil && c.version == version {
		return append([]sluice.Override(nil), c.list...), nil
	}
	cmd := redis.NewMapStringStringCmd(ctx, "hgetall", s.prefix+overridesKey)
	if err := s.client.Process(ctx, cmd); err != nil {
		return nil, s.classifyRead(ctx, "Overrides", err)
	}
	list := make([]sluice.Override, 0, len(cmd.Val()))
	for field, value := range cmd.Val() {
		o, err := decodeOverride(field, value)
		if err != nil {
			// One field this store cannot read (another tool's, a later
			// format's) must not stop every other override from applying.
			if s.onSkipped != nil {
				s.onSkipped(fmt.Errorf("redisstore: Overrides: skipped: %w", err))
			}
			continue
		}
		list = append(list, o)
	}
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		return a.Policy < b.Policy || a.Policy == b.Policy && a.Subject < b.Subject
	})
	s.ovrCache.Store(&overrideCache{version: version, list: list})
	return append([]sluice.Override(nil), list...), nil
}

// overrideVersion returns the version counter, "" while absent.
func (s *Store) overrideVersion(ctx context.Context) (string, error) {
	cmd := redis.NewStringCmd(ctx, "get", s.prefix+versionKey)
	err := s.client.Process(ctx, cmd)
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", s.classifyRead(ctx, "Overrides", err)
	}
	return cmd.Val(), nil
}

// overrideFormat is the format of the values this store writes and
// reads: the number before the first '|'.
const overrideFormat = "1"

// decodeOverride reads one field and value of the overrides hash. A
// value of another format is refused by its number.
func decodeOverride(field, value string) (sluice.Override, error) {
	policy, subject, ok := strings.Cut(field, "\x00")
	parts := strings.SplitN(value, "|", 5)
	switch {
	case parts[0] != overrideFormat:
		return sluice.Override{}, fmt.Errorf("override field %q = %q: format %q: this store reads format %s only (written by another tool or a later sluice)", field, value, parts[0], overrideFormat)
	case !ok:
		return sluice.Override{}, fmt.Errorf("override field %q = %q: must be a policy and a subject apart by a 0 byte", field, value)
	case len(parts) != 5:
		return sluice.Override{}, fmt.Errorf("override field %q = %q: must be format|limit|burst|window µs|note", field, value)
	}
	var n [3]int64
	for i := range n {
		v, err := strconv.ParseInt(parts[i+1], 10, 64)
		if err != nil || v < 0 {
			return sluice.Override{}, fmt.Errorf("override field %q = %q: %s = %q: must be a whole number, at least 0", field, value, [3]string{"limit", "burst", "window"}[i], parts[i+1])
		}
		n[i] = v
	}
	return sluice.Override{Policy: policy, Subject: subject, Limit: n[0], Burst: n[1], Window: time.Duration(n[2]) * time.Microsecond, Note: parts[4]}, nil
}
