package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
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
// one slot of a Cluster. Plain commands: HSET, HDEL, HGETALL, GET, INCR.
const (
	overridesKey = "{overrides}"
	versionKey   = "{overrides}:version"
)

// overrideCache is the list as last read and the version it was read at.
type overrideCache struct {
	version string
	list    []sluice.Override
}

// PutOverride keeps overrides for sluice.Limiter: it stores o in Redis (or,
// with o.Limit 0, removes it) and moves the version every reader polls.
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
	pipe := s.client.Pipeline()
	if o.Limit == 0 {
		pipe.HDel(ctx, s.prefix+overridesKey, field)
	} else {
		value := fmt.Sprintf("1|%d|%d|%d|%s", o.Limit, o.Burst, o.Window.Microseconds(), o.Note)
		pipe.HSet(ctx, s.prefix+overridesKey, field, value)
	}
	pipe.Incr(ctx, s.prefix+versionKey)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redisstore: PutOverride: %w", err)
	}
	return nil
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
