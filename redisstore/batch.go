package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redisreply"
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
	args    []any           // the decision's command: name, code, number of keys, keys, ARGV (the last one its mark, once armed)
	keys    int             // how many keys args holds
	key     keyArg          // its first key, which its command holds as &key
	alone   bool            // the decision carries state (ARGV_CARRY "carry"): never in a decideAll call
	mark    mark            // its last argument while it is sent: notes when go-redis writes it
	lease   text            // a short decision's lease, its argument
	spec    string          // a short decision on Redis time: its spec (shortSpec), by which a decideAll call sends it (a lease's with its lease); else ""
	limit   int64           // with spec: the decision's limit, which a compact reply leaves out
	whole   [2]int64        // with spec, compact set: the compact reply's remaining and resetAfter
	at      int64           // with spec, compact set: the time its decideAll call decided at
	compact bool            // set by spread: the reply is whole and at, not in cmd
	ref     mark            // with spec: its key in a decideAll call, which notes when it is written
	cmd     scriptCmd       // its own command, or where a decideAll call leaves its reply; made when first needed (command)
	ctx     context.Context // its caller's, for the command made late
	wrote   bool            // set by its sender: the command, or the decideAll call that held it, was written
	batch   int             // set by its sender: how many decisions the round trip held (sluice.Evaluation.Batch)
	wait    *redis.IntCmd
	err     error // the command's error, typed by typeErr
	state   atomic.Int32
	done    chan struct{} // receives one value when cmd holds the reply or err is set
}

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// command returns p's own command, made now if it was not yet: a
// decision by spec whose decideAll call answered it compactly needs none.
func (p *pending) command() scriptCmd {
	if p.cmd.Cmd == nil {
		p.cmd = newScriptCmd(p.ctx, p.args)
	}
	return p.cmd
}

// cmdErr returns the error of p's command, nil while it has none.
func (p *pending) cmdErr() error {
	if p.cmd.Cmd == nil {
		return nil
	}
	return p.cmd.Err()
}

// batcher sends the decisions that meet at one node (the store's Redis,
// or one master of a Cluster: a master that hangs holds up only its own)
// to it together. A caller who finds nothing on the wire sends its
// decision itself, at once, with no hand-off. Callers who arrive while
// something is on the wire queue; Senders goroutines each wait for work,
// take everything queued, send it in one round trip and hand each
// decision its own reply. To one Redis (not a Cluster or a Ring, whose
// decisions of different subjects live in different slots) the queued
// decisions go as decideAll calls of at most maxAll decisions each, which
// cost Redis less than one call per decision; otherwise as a pipeline of
// their own calls (a lone decision as a plain command). No timer ever
// holds a decision back.
type batcher struct {
	s        *Store
	n        *node
	together bool         // one Redis: queued decisions may share a decideAll call
	inflight atomic.Int32 // round trips on the wire, by callers and senders
	mu       sync.Mutex
	queue    []*pending
	closed   bool
	wake     chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
}

func newBatcher(s *Store, n *node, senders int) *batcher {
	b := &batcher{s: s, n: n, together: s.cluster == nil && s.ring == nil, wake: make(chan struct{}, senders), stop: make(chan struct{})}
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
		b.exec(batch, false)
		b.inflight.Add(-1)
		for i, p := range batch {
			p.done <- struct{}{}
			batch[i] = nil
		}
	}
}

// exec sends batch and leaves each reply in its command and each typed
// error in err. A decision whose node did not hold the code certainly did
// not run: the code is loaded there and the decision sent once more. all
// is pipeline's.
func (b *batcher) exec(batch []*pending, all bool) {
	s := b.s
	ctx, cancel := s.callContext(context.Background())
	defer cancel()
	b.pipeline(ctx, batch, all)
	var retry []*pending
	var lerr error // loading the code on the node: once for the batch, in each form
	loaded, loadedScripts := false, false
	for _, p := range batch {
		if err := p.cmdErr(); redisreply.NotLoaded(err) {
			if msg := redisreply.Error(err); redisreply.NoFunctions(msg) {
				s.fallBack("redis refused FCALL: " + msg)
			}
			if !loaded || s.scripts.Load() != loadedScripts {
				lerr = s.loadNode(ctx, b.n, p.key.b, err)
				loaded, loadedScripts = true, s.scripts.Load() // the form it loaded
			}
			if lerr != nil {
				p.err = reloadFailed(err, lerr)
				continue
			}
			p.args[0], p.args[1] = s.call() // loading may have fallen back to scripts
			p.mark.arm(p.args)
			p.cmd = newScriptCmd(ctx, p.args)
			retry = append(retry, p)
		}
	}
	if len(retry) > 0 {
		b.pipeline(ctx, retry, all)
	}
	var failed error
	for _, p := range batch {
		if p.err == nil {
			if err := p.cmdErr(); err != nil {
				p.err = s.typeErr(ctx, "run script", p.wrote, err)
			} else {
				p.err = s.waited(p.wait)
			}
		}
		if failed == nil && failedFor(p.err) {
			failed = p.err
		}
	}
	s.record(ctx, b.n, failed)
}

// maxAll is the most decisions one decideAll call takes: Redis runs a
// call to its end before it serves anyone else.
const maxAll = 64

// pipeline sends batch in one round trip (with WaitReplicas, the WAIT
// after it) and leaves each decision's reply or error in its command; a
// lone decision as a plain command, unless all (send's).
func (b *batcher) pipeline(ctx context.Context, batch []*pending, all bool) {
	s := b.s
	if len(batch) == 1 && s.replicas == 0 && !all {
		p := batch[0]
		if err := s.client.Process(ctx, p.command()); err != nil && p.cmd.Err() == nil {
			p.cmd.SetErr(err)
		}
		p.wrote, p.wait, p.batch = p.mark.written.Load(), nil, 1
		return
	}
	var pipe redis.Pipeliner
	if s.replicas > 0 {
		pipe = s.direct(b.n).Pipeline() // the WAIT must follow the decisions on their connection
	} else {
		pipe = s.client.Pipeline()
	}
	var cmds []scriptCmd // the decideAll calls, maxAll decisions each; none when the batch cannot share one
	if b.shareable(batch) {
		for i := 0; i < len(batch); i += maxAll {
			c := allCmd(ctx, batch[i:min(i+maxAll, len(batch))])
			cmds = append(cmds, c)
			pipe.Process(ctx, c)
		}
	} else {
		for _, p := range batch {
			pipe.Process(ctx, p.command())
		}
	}
	var w *redis.IntCmd
	if s.replicas > 0 {
		w = s.waitCmd(ctx)
		pipe.Process(ctx, w)
	}
	_, err := pipe.Exec(ctx)
	for i, c := range cmds {
		spread(c, batch[i*maxAll:min((i+1)*maxAll, len(batch))])
	}
	for _, p := range batch {
		// A decideAll call writes the marks of its decisions, or their keys.
		p.wrote, p.wait, p.batch = p.mark.written.Load() || p.ref.written.Load(), w, len(batch)
	}
	if err != nil && !errors.As(err, new(redis.Error)) {
		// A failure of the whole pipeline: every command without an
		// answer of its own carries it.
		for _, p := range batch {
			if !p.compact && p.command().Err() == nil && p.cmd.Val() == nil {
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
// (see batch.lua): their keys (a decision by spec: its key as its mark),
// the number of decisions, the number of heads, the number of distinct
// specs and the specs, the heads (a run of consecutive decisions by spec j: "-j" and the run's
// length; any other decision: its number of keys), then the others'
// arguments and the leases of decisions by a lease's spec, in order.
func allCmd(ctx context.Context, batch []*pending) scriptCmd {
	keys, argv, heads := 0, 0, 0
	var specs []string
	last := ""
	for _, p := range batch {
		keys += p.keys
		if p.spec != "" && !slices.Contains(specs, p.spec) {
			if len(specs) < len(specRefs) {
				specs = append(specs, p.spec)
			} else {
				p.spec = "" // beyond the specs one call names: it goes with its own arguments
			}
		}
		if p.spec == "" {
			argv += len(p.args) - 3 - p.keys
			heads++
		} else if p.spec != last {
			heads += 2
		}
		if leaseSpec(p.spec) {
			argv++
		}
		last = p.spec
	}
	args := make([]any, 0, 3+keys+3+len(specs)+heads+argv)
	args = append(args, callAll[0], callAll[1], keys)
	for _, p := range batch {
		if p.spec != "" {
			p.ref.src = p.key.b
			args = append(args, &p.ref)
		} else {
			args = append(args, p.args[3:3+p.keys]...)
		}
	}
	args = append(args, len(batch), heads, len(specs))
	for _, sp := range specs {
		args = append(args, sp)
	}
	for i := 0; i < len(batch); {
		p := batch[i]
		if p.spec == "" {
			args = append(args, p.keys)
			i++
			continue
		}
		n := 1
		for i+n < len(batch) && batch[i+n].spec == p.spec {
			n++
		}
		args = append(args, specRefs[slices.Index(specs, p.spec)], n)
		i += n
	}
	for _, p := range batch {
		if p.spec == "" {
			args = append(args, p.args[3+p.keys:]...) // its mark last
		} else if leaseSpec(p.spec) {
			args = append(args, &p.lease)
		}
	}
	return newScriptCmd(ctx, args)
}

// leaseSpec reports whether spec is a lease's (an acquire or a release):
// a decision by it names its lease beside it.
func leaseSpec(spec string) bool {
	return spec != "" && (spec[0] == 'a' || spec[0] == 'r')
}

// specRefs are the heads of runs of decisions by spec in a decideAll
// call, "-1" to "-64": spec j, one key each, no arguments of their own.
var specRefs = func() (v [maxAll]string) {
	for i := range v {
		v[i] = "-" + strconv.Itoa(i+1)
	}
	return v
}()

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

// send runs the decision p holds on the node its key belongs to, through
// that node's senders or alone, and returns the script's reply appended
// to dst, or the error typed by typeErr. It sets ev.Batch. With all
// (evaluate's, for tests), a node with senders takes it in a decideAll
// call of its own, sent from its caller.
func (s *Store) send(ctx context.Context, p *pending, ev *sluice.Evaluation, dst []int64, all bool) ([]int64, error) {
	n := s.nodeFor(ctx, p.key.b)
	if err := n.breaker.allow(); err != nil {
		s.release(p)
		return nil, n.errOpen
	}
	b := n.batch
	if b == nil || !all && b.inflight.CompareAndSwap(0, 1) {
		// Nothing on the wire: this decision goes now, from its caller.
		if b != nil {
			defer b.inflight.Add(-1)
		}
		defer s.release(p)
		if err := ctx.Err(); err != nil {
			n.breaker.none() // nothing asked of Redis
			return nil, err
		}
		ctx, cancel := s.callContext(ctx)
		defer cancel()
		err := s.sendAlone(ctx, n, p)
		s.record(ctx, n, err)
		if err != nil {
			return nil, err
		}
		ev.Batch = 1
		return int64s(p.cmd, dst)
	}
	p.mark.arm(p.args)
	p.ref.written.Store(false)
	p.cmd, p.ctx, p.err, p.wrote, p.wait, p.compact = scriptCmd{}, ctx, nil, false, nil, false
	reuse, err := true, error(nil)
	if all {
		b.exec([]*pending{p}, true) // as a sender would, had it met p alone
	} else {
		reuse, err = b.do(ctx, p)
	}
	if reuse {
		defer s.release(p)
	}
	if err != nil {
		if !failedFor(err) {
			n.breaker.none() // taken back before a sender had it: its round trip is not this caller's
		}
		return nil, err
	}
	if p.err != nil {
		return nil, p.err
	}
	ev.Batch = p.batch
	return p.values(dst)
}

// sendAlone sends p's decision to n in a round trip of its own and
// returns its error, typed.
func (s *Store) sendAlone(ctx context.Context, n *node, p *pending) error {
	p.mark.arm(p.args)
	p.cmd = newScriptCmd(ctx, p.args)
	w, err := s.exchange(ctx, n, p.cmd)
	if redisreply.NotLoaded(err) {
		// The code certainly did not run: load it where the key lives
		// and try once more.
		if lerr := s.loadNode(ctx, n, p.key.b, err); lerr != nil {
			return reloadFailed(err, lerr)
		}
		p.args[0], p.args[1] = s.call() // loading may have fallen back to scripts
		p.mark.arm(p.args)
		p.cmd = newScriptCmd(ctx, p.args)
		w, err = s.exchange(ctx, n, p.cmd)
	}
	if err != nil {
		return s.typeErr(ctx, "run script", p.mark.written.Load(), err)
	}
	return s.waited(w)
}

// exchange sends cmd to n, with WaitReplicas in one pipeline with the
// WAIT after it, and returns cmd's error and the WAIT.
func (s *Store) exchange(ctx context.Context, n *node, cmd scriptCmd) (*redis.IntCmd, error) {
	if s.replicas == 0 {
		err := s.client.Process(ctx, cmd)
		if err == nil {
			err = cmd.Err()
		}
		return nil, err
	}
	pipe := s.direct(n).Pipeline()
	pipe.Process(ctx, cmd)
	w := s.waitCmd(ctx)
	pipe.Process(ctx, w)
	pipe.Exec(ctx)
	return w, cmd.Err()
}

// waitCmd returns the WAIT that follows decisions: for WaitReplicas
// replicas, at most half the time left before ctx's deadline (1s without
// one), so that its answer comes back within the round trip's bound.
func (s *Store) waitCmd(ctx context.Context) *redis.IntCmd {
	ms := int64(1000)
	if d, ok := ctx.Deadline(); ok {
		ms = max(time.Until(d).Milliseconds()/2, 1)
	}
	return redis.NewIntCmd(ctx, "wait", s.replicas, ms)
}

// waited types what w, the WAIT after a decision Redis took (nil
// without WaitReplicas), answered: fewer replicas than asked means the
// decision is spent on the master and may yet be lost with it.
func (s *Store) waited(w *redis.IntCmd) error {
	switch {
	case w == nil:
		return nil
	case w.Err() != nil:
		return fmt.Errorf("redisstore: decided on the master, no answer to WAIT %d: %w: %w", s.replicas, sluice.ErrIndeterminate, w.Err())
	case w.Val() < int64(s.replicas):
		return fmt.Errorf("redisstore: decided on the master, acknowledged by %d of %d replicas (WAIT): it may be lost in a failover: %w", w.Val(), s.replicas, sluice.ErrIndeterminate)
	}
	return nil
}

// release returns p to the pool, dropping what it references.
func (s *Store) release(p *pending) {
	clear(p.args)
	p.cmd, p.ctx, p.err, p.wait, p.mark.arg, p.lease.s, p.spec, p.ref.src, p.key.b = scriptCmd{}, nil, nil, nil, "", "", "", nil, p.key.b[:0]
	pendingPool.Put(p)
}
