package redisstore

import "github.com/sluicehq/sluice"

// Key returns the Redis key of p's state for subject, for the tests of
// package redisstore_test.
func (s *Store) Key(subject string, p *sluice.Policy) string { return s.key(subject, p) }

// StateBinary is the first byte of a fixed-size state as the script
// stores it (codec.lua's STATE_BINARY); its fields follow as
// little-endian IEEE doubles.
const StateBinary = 1

// Queued returns how many decisions wait in the queue of s's Redis (not
// a Cluster's), for tests that wait until callers have queued rather
// than sleep.
func (s *Store) Queued() int {
	b := s.one.batch
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// OnRedisTime makes s call f with the time each decision on Redis time
// was taken at, as the script answers it (nil: not called).
func (s *Store) OnRedisTime(f func(now int64)) { s.onRedisTime = f }

// SetPeriodBounds makes s send f(p) as the bounds of a calendar period's
// policy p instead of the calendar's around its clock (nil: the
// calendar's), so a test on Redis time drives periods of a few ms.
func (s *Store) SetPeriodBounds(f func(p *sluice.Policy) [4]int64) { s.periodBounds = f }

// SetBatched makes s send every decision through its senders in a
// decideAll call (true), even alone, so a test drives batch.lua's path
// (decisions by spec, compact replies) as hard as the others.
func (s *Store) SetBatched(batched bool) { s.batchAll = batched }

// ScriptSHA is the SHA-1 of the decision code as a script (EVALSHA).
var ScriptSHA = scriptSHA
