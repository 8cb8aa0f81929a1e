package redisstore

import (
	"context"

	"github.com/sluicehq/sluice"
)

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

// Driven is a Store driven by a test down what production meets only
// sometimes: its Evaluate is the Store's, through the one unexported
// evaluate (Evaluate's false and nil are the fields' zero values). The
// Store's other methods are its own.
type Driven struct {
	*Store
	// Batched sends every decision in a decideAll call, even alone, so a
	// test drives batch.lua's path (decisions by spec, compact replies)
	// as hard as the others.
	Batched bool
	// Bounds, when not nil, gives the bounds of a calendar period's policy
	// p instead of the calendar's around the store's clock, so a test on
	// Redis time drives periods of a few ms.
	Bounds func(p *sluice.Policy) [4]int64
	// OnRedisTime, when not nil, is called with the time each decision on
	// Redis time was taken at, as the script answers it.
	OnRedisTime func(now int64)
}

// Evaluate implements sluice.Store.
func (d *Driven) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	at, err := d.evaluate(ctx, ev, d.Batched, d.Bounds)
	if err == nil && d.OnRedisTime != nil && d.clock == nil {
		d.OnRedisTime(at)
	}
	return err
}

// ScriptSHA is the SHA-1 of the decision code as a script (EVALSHA).
var ScriptSHA = scriptSHA
