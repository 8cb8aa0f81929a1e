package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// check is what a readiness check found besides what it recorded on each
// node: a Cluster's masters at the time (nil otherwise, or when the slot
// map could not be had).
type check struct {
	masters map[string]bool
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
