package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// scriptCmd is an FCALL or EVALSHA that go-redis must never retry on its
// own: a retry after the command was written could spend twice. go-redis
// does not replay a pipeline that holds one either.
type scriptCmd struct{ *redis.Cmd }

// NoRetry implements redis.Cmder.
func (scriptCmd) NoRetry() bool { return true }

func newScriptCmd(ctx context.Context, args []any) scriptCmd {
	cmd := scriptCmd{redis.NewCmd(ctx, args...)}
	cmd.SetFirstKeyPos(3)
	return cmd
}

// The life of a queued decision: a sender takes it (sent) unless its
// caller gave up first (abandoned).
const (
	queued int32 = iota
	sent
	abandoned
)

// pending is one decision waiting for, or on, the wire.
type pending struct {
	args  []any     // the decision's command: name, code, number of keys, keys, ARGV
	keys  int       // how many keys args holds
	alone bool      // the decision carries state (ARGV_CARRY "carry"): never in a decideAll call
	cmd   scriptCmd // its own command, or where a decideAll call leaves its reply
	err   error     // the command's error, typed by classify
	state atomic.Int32
	done  chan struct{} // receives one value when cmd holds the reply or err is set
}

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// batcher sends the decisions that meet at a Store to Redis together.
// A caller who finds nothing on the wire sends its decision itself, at
// once, with no hand-off. Callers who arrive while something is on the
// wire queue; Senders goroutines each wait for work, take everything
// queued, send it in one round trip and hand each decision its own reply.
// To one Redis (not a Cluster or a Ring, whose decisions of different
// subjects live on different nodes) the queued decisions go as decideAll
// calls of at most maxAll decisions each, which cost Redis less than one
// call per decision; otherwise as a pipeline of their own calls (a lone
// decision as a plain command). No timer ever holds a decision back.
type batcher struct {
	s        *Store
	together bool         // one Redis: queued decisions may share a decideAll call
	inflight atomic.Int32 // round trips on the wire, by callers and senders
	mu       sync.Mutex
	queue    []*pending
	closed   bool
	wake     chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
}

func newBatcher(s *Store, senders int) *batcher {
	_, one := s.client.(*redis.Client)
	b := &batcher{s: s, together: one, wake: make(chan struct{}, senders), stop: make(chan struct{})}
	b.wg.Add(senders)
	for range senders {
		go b.send()
	}
	return b
}

// errClosed is the error of a decision asked of a closed store.
var errClosed = fmt.Errorf("redisstore: store closed: %w", sluice.FailedBeforeSend)

// do sends p and waits for its reply, or for ctx: a decision still queued
// then is taken back (nothing was sent) and returns ctx's error; one on
// the wire returns ErrIndeterminate. It reports whether p may be pooled.
func (b *batcher) do(ctx context.Context, p *pending) (reuse bool, err error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return true, errClosed
	}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default: // every sender is awake already and will find it
	}
	select {
	case <-p.done:
		return true, nil
	case <-ctx.Done():
		if p.state.CompareAndSwap(queued, abandoned) {
			return false, ctx.Err()
		}
		return false, fmt.Errorf("redisstore: sent, no reply before the caller's deadline: %w: %w", sluice.ErrIndeterminate, ctx.Err())
	}
}

// take moves what is queued into into, skipping abandoned decisions.
func (b *batcher) take(into []*pending) []*pending {
	b.mu.Lock()
	q := b.queue
	b.queue = nil
	b.mu.Unlock()
	for _, p := range q {
		if p.state.CompareAndSwap(queued, sent) {
			into = append(into, p)
		}
	}
	return into
}

func (b *batcher) send() {
	defer b.wg.Done()
	var batch []*pending
	for {
		select {
		case <-b.stop:
			for _, p := range b.take(batch[:0]) {
				p.err = errClosed
				p.done <- struct{}{}
			}
			return
		case <-b.wake:
		}
		batch = b.take(batch[:0])
		if len(batch) == 0 {
			continue
		}
		b.inflight.Add(1)
		b.exec(batch)
		b.inflight.Add(-1)
		for i, p := range batch {
			p.done <- struct{}{}
			batch[i] = nil
		}
	}
}

// exec sends batch and leaves each reply in its command. A decision whose
// node did not hold the code certainly did not run: the code is loaded
// there and the decision sent once more.
func (b *batcher) exec(batch []*pending) {
	ctx, cancel := b.s.callContext(context.Background())
	defer cancel()
	b.pipeline(ctx, batch)
	var retry []*pending
	for _, p := range batch {
		if err := p.cmd.Err(); notLoaded(err) {
			if lerr := b.s.loadNode(ctx, p.args[3].(string)); lerr != nil {
				p.err = b.s.classify(ctx, "reload after "+err.Error(), lerr)
				continue
			}
			p.args[0], p.args[1] = b.s.call() // loading may have fallen back to scripts
			p.cmd = newScriptCmd(ctx, p.args)
			retry = append(retry, p)
		}
	}
	if len(retry) > 0 {
		b.pipeline(ctx, retry)
	}
	var failed error
	for _, p := range batch {
		switch err := p.cmd.Err(); {
		case err == nil || p.err != nil:
		case len(batch) > 1 && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
			// A pipeline cut short by its deadline reports the bare
			// context error whether or not it was written: it may have run.
			p.err = fmt.Errorf("redisstore: run script in a pipeline: %w: %w", sluice.ErrIndeterminate, err)
		default:
			p.err = b.s.classify(ctx, "run script", err)
		}
		if failed == nil && p.err != nil {
			failed = p.err
		}
	}
	b.s.roundTrip(failed)
}

// maxAll is the most decisions one decideAll call takes: Redis runs a
// call to its end before it serves anyone else.
const maxAll = 64

// pipeline sends batch in one round trip and leaves each decision's reply
// or error in its command.
func (b *batcher) pipeline(ctx context.Context, batch []*pending) {
	if len(batch) == 1 {
		b.s.client.Process(ctx, batch[0].cmd)
		return
	}
	pipe := b.s.client.Pipeline()
	var cmds []scriptCmd // the decideAll calls, maxAll decisions each; none when the batch cannot share one
	if b.shareable(batch) {
		for i := 0; i < len(batch); i += maxAll {
			c := allCmd(ctx, batch[i:min(i+maxAll, len(batch))])
			cmds = append(cmds, c)
			pipe.Process(ctx, c)
		}
	} else {
		for _, p := range batch {
			pipe.Process(ctx, p.cmd)
		}
	}
	_, err := pipe.Exec(ctx)
	for i, c := range cmds {
		spread(c, batch[i*maxAll:min((i+1)*maxAll, len(batch))])
	}
	if err != nil && !errors.As(err, new(redis.Error)) {
		// A failure of the whole pipeline: every command without an
		// answer of its own carries it.
		for _, p := range batch {
			if p.cmd.Err() == nil && p.cmd.Val() == nil {
				p.cmd.SetErr(err)
			}
		}
	}
}

// shareable reports whether every decision of batch may go in a
// decideAll call: to one Redis, as functions, none carrying state.
func (b *batcher) shareable(batch []*pending) bool {
	if !b.together || b.s.scripts.Load() {
		return false
	}
	for _, p := range batch {
		if p.alone || p.args[0] != callFunction[0] {
			return false
		}
	}
	return true
}

// allCmd returns the decideAll call that takes the decisions of batch
// (see redisstore.lua): their number, each one's number of keys, then
// their keys and their arguments, in order.
func allCmd(ctx context.Context, batch []*pending) scriptCmd {
	keys, argv := 0, 0
	for _, p := range batch {
		keys += p.keys
		argv += len(p.args) - 3 - p.keys
	}
	args := make([]any, 0, 3+keys+1+len(batch)+argv)
	args = append(args, callAll[0], callAll[1], keys)
	for _, p := range batch {
		args = append(args, p.args[3:3+p.keys]...)
	}
	args = append(args, len(batch))
	for _, p := range batch {
		args = append(args, p.keys)
	}
	for _, p := range batch {
		args = append(args, p.args[3+p.keys:]...)
	}
	return newScriptCmd(ctx, args)
}

// spread hands each decision of batch its part of c's reply: its own
// reply or error reply, or c's error when the call failed as a whole.
func spread(c scriptCmd, batch []*pending) {
	replies, err := c.Slice()
	if err == nil && len(replies) != len(batch) {
		err = fmt.Errorf("redisstore: decideAll answered %d replies for %d decisions: %w", len(replies), len(batch), sluice.ErrIndeterminate)
	}
	for i, p := range batch {
		if err != nil {
			p.cmd.SetErr(err)
		} else if rerr, ok := replies[i].(error); ok {
			p.cmd.SetErr(rerr) // the decision's own error reply (SLUICE_CORRUPT, …)
		} else {
			p.cmd.SetVal(replies[i])
		}
	}
}

// close stops the senders; decisions still queued fail before send.
func (b *batcher) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	b.wg.Wait()
}
