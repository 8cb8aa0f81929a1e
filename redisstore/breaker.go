package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// BreakerOptions configure a Store's circuit breakers. The zero value
// means the defaults.
//
// One Redis (a Client, Sentinel-managed or not, or a Ring) has one
// breaker. A Redis Cluster has one per master, keyed by its address: a
// decision asks the breaker of the master that owns its subject's slot,
// so a master that hangs or fails over sheds only its own slots and
// decisions on the other masters go on.
type BreakerOptions struct {
	// Failures is how many round trips to a Redis in a row must fail
	// before its breaker opens: from then on decisions fail at once with
	// sluice.CircuitOpen, without waiting for a Redis that is down or
	// hung.
	//
	// A round trip fails when it ends for want of Redis: no connection,
	// a connection lost, a command not written, Redis refusing the call
	// before it runs (READONLY, OOM, LOADING, …), or no reply before a
	// deadline. The deadline is the store's Options.Timeout or the
	// caller's own, whichever comes first: a round trip the store began
	// and a deadline cut off is what a hung Redis looks like, however
	// short the caller's deadline, so sequential callers with a 500ms
	// deadline open the breaker as surely as the store's 1s timeout.
	// These do not count: a caller whose context was done before the
	// store began the round trip (nothing was asked of Redis), and one
	// that cancelled it (context.Canceled: the caller left, Redis was not
	// shown late). Any answer of Redis's own (a decision, a denial, a
	// corrupt state) resets the count. Give decisions a deadline a live
	// Redis meets: one cut off sooner than Redis can answer counts too.
	// Negative disables the breakers. Default: 5.
	Failures int
	// OpenFor is, without a probe (ProbeEvery negative), how long a
	// breaker stays open before it lets one decision through to try
	// Redis again (half open). Half open, a breaker lets one decision
	// through at a time (another only once that one's round trip has
	// had Options.Timeout, or OpenFor if longer, to end): a round trip
	// that succeeds closes the breaker, one that fails opens it again.
	// Default: 1s.
	OpenFor time.Duration
	// ProbeEvery is how often, while a breaker is open, the store PINGs
	// that Redis itself (each PING bounded by Options.Timeout, one at a
	// time): the first answer half-opens the breaker, so decisions are
	// taken again within about ProbeEvery of Redis being back, and until
	// then every decision is shed at once: none waits on a Redis that
	// does not answer a PING. Negative disables the probe, leaving
	// OpenFor to half-open the breaker. Default: 100ms.
	ProbeEvery time.Duration
	// OnChange, when set, is called with each new state of the store
	// ("closed", "open", "half_open"), one call at a time; for metrics
	// and logs. On a Cluster the store's state is its worst master's:
	// open while any master's breaker is open, half_open while none is
	// open and one is half open, closed otherwise. Default: nil.
	OnChange func(state string)
}

// The states of a breaker. closedClean is closed with no failure since the
// last success: the state of nearly every decision, checked without the
// lock.
const (
	closedClean int32 = iota
	closedFailing
	halfOpen
	open
)

var stateNames = [...]string{closedClean: "closed", closedFailing: "closed", halfOpen: "half_open", open: "open"}

// breaker counts one Redis's consecutive failures and sheds decisions
// while that Redis is known to be failing. Safe for concurrent use; the
// nil *breaker (disabled) lets everything through.
type breaker struct {
	failures int
	openFor  time.Duration
	trialFor time.Duration // how long a decision let through half open holds back the next one
	onChange func(string)
	// notify, when set, is called instead of onChange with each new state
	// and a number that grows with every change, so that a listener can
	// tell a late call from a newer one.
	notify func(state string, seq uint64)
	now    func() time.Time

	// probe asks Redis whether it answers, every probeEvery while open,
	// from one goroutine at a time that stop ends; nil: no probe.
	probe      func(context.Context) error
	probeEvery time.Duration
	probeCtx   context.Context
	stop       context.CancelFunc
	probes     sync.WaitGroup
	// idle, when set, is called (and the probe ends) once the breaker has
	// been open for idleAfter without a decision asking it: the node is
	// no longer routed to (a master replaced after a failover).
	idle      func()
	idleAfter time.Duration

	st atomic.Int32 // the state; written under mu

	mu      sync.Mutex
	probing bool      // a probe goroutine runs
	failed  int       // consecutive failed round trips while closed
	since   time.Time // when it opened
	trial   bool      // half open: a decision is out, its round trip not yet reported
	trialAt time.Time // when that decision was let through
	asked   time.Time // when a decision last asked while it was not closed
	seq     uint64
}

func newBreaker(o BreakerOptions, probe func(context.Context) error) *breaker {
	if o.Failures < 0 {
		return nil
	}
	if o.Failures == 0 {
		o.Failures = 5
	}
	if o.OpenFor <= 0 {
		o.OpenFor = time.Second
	}
	if o.ProbeEvery == 0 {
		o.ProbeEvery = 100 * time.Millisecond
	}
	b := &breaker{failures: o.Failures, openFor: o.OpenFor, trialFor: o.OpenFor, onChange: o.OnChange, now: time.Now}
	if o.ProbeEvery > 0 && probe != nil {
		b.probe, b.probeEvery = probe, o.ProbeEvery
	}
	b.probeCtx, b.stop = context.WithCancel(context.Background())
	return b
}

// close stops the probe, if one runs, and waits for it.
func (b *breaker) close() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.stop()
	b.mu.Unlock()
	b.probes.Wait()
}

// set moves to state s and returns the change to report; mu held.
func (b *breaker) set(s int32) (string, uint64) {
	old := b.st.Load()
	b.st.Store(s)
	if stateNames[old] == stateNames[s] {
		return "", 0
	}
	b.seq++
	if s == open {
		b.since, b.asked = b.now(), b.now()
		b.opened()
	}
	return stateNames[s], b.seq
}

func (b *breaker) report(state string, seq uint64) {
	switch {
	case state == "":
	case b.notify != nil:
		b.notify(state, seq)
	case b.onChange != nil:
		b.onChange(state)
	}
}

// opened starts the probe goroutine unless one runs or the breaker is
// closed for good. Called with mu held, on entering the open state.
func (b *breaker) opened() {
	if b.probe == nil || b.probing || b.probeCtx.Err() != nil {
		return
	}
	b.probing = true
	b.probes.Add(1)
	go b.probeLoop()
}

// probeLoop PINGs Redis every probeEvery while the breaker is open; the
// first answer half-opens it, so the next decision goes through.
func (b *breaker) probeLoop() {
	defer b.probes.Done()
	t := time.NewTicker(b.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-b.probeCtx.Done():
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
			return
		case <-t.C:
		}
		b.mu.Lock()
		if b.st.Load() != open {
			b.probing = false
			b.mu.Unlock()
			return
		}
		if b.idle != nil && b.now().Sub(b.asked) >= b.idleAfter {
			b.probing = false
			b.stop()
			b.mu.Unlock()
			b.idle()
			return
		}
		b.mu.Unlock()
		if !answers(b.probe(b.probeCtx)) {
			continue
		}
		b.mu.Lock()
		var state string
		var seq uint64
		if b.st.Load() == open {
			b.trial = false
			state, seq = b.set(halfOpen)
		}
		b.probing = false
		b.mu.Unlock()
		b.report(state, seq)
		return
	}
}

// answers reports whether err, a probe's, shows Redis answering: no
// error, or an error reply of its own (a user not allowed PING, …).
func answers(err error) bool {
	var rerr redis.Error
	return err == nil || errors.As(err, &rerr) && !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrClosed)
}

// errOpen is the error of a decision the breaker of the store's one Redis
// did not let through; a Cluster master's names the master.
var errOpen = fmt.Errorf("redisstore: Redis is failing, not asked: %w", sluice.CircuitOpen)

// allow reports whether a decision may go to Redis (nil) or must be shed
// (errOpen): always while closed; while open, none (without a probe,
// none until OpenFor has passed); half open, one at a time. Every decision allowed is to be
// reported: roundTrip, or none when it learnt nothing of Redis.
func (b *breaker) allow() error {
	if b == nil || b.st.Load() <= closedFailing {
		return nil
	}
	b.mu.Lock()
	now := b.now()
	b.asked = now
	var state string
	var seq uint64
	switch b.st.Load() {
	case closedClean, closedFailing:
	case open:
		if b.probe != nil || now.Sub(b.since) < b.openFor {
			b.mu.Unlock()
			return errOpen // the probe half-opens it, or OpenFor
		}
		state, seq = b.set(halfOpen)
		b.trial, b.trialAt = true, now
	case halfOpen:
		if b.trial && now.Sub(b.trialAt) < b.trialFor {
			b.mu.Unlock()
			return errOpen
		}
		b.trial, b.trialAt = true, now
	}
	b.mu.Unlock()
	b.report(state, seq)
	return nil
}

// closed reports whether the breaker lets every decision through now.
func (b *breaker) closed() bool {
	return b == nil || b.st.Load() <= closedFailing
}

// isOpen reports whether the breaker sheds every decision now.
func (b *breaker) isOpen() bool {
	return b != nil && b.st.Load() == open
}

// roundTrip records how a round trip to Redis ended: err is the error
// of (one of) its decisions, typed, nil when Redis answered. Only
// failures for want of Redis count (failedFor); a denial or a corrupt
// state is Redis answering.
func (b *breaker) roundTrip(err error) {
	failed := failedFor(err)
	if b == nil || !failed && b.st.Load() == closedClean {
		return
	}
	b.mu.Lock()
	var state string
	var seq uint64
	switch s := b.st.Load(); {
	case !failed:
		b.failed, b.trial = 0, false
		state, seq = b.set(closedClean)
	case s == halfOpen:
		b.trial = false
		state, seq = b.set(open)
	case s == closedClean, s == closedFailing:
		if b.failed++; b.failed >= b.failures {
			state, seq = b.set(open)
		} else {
			b.st.Store(closedFailing)
		}
	}
	b.mu.Unlock()
	b.report(state, seq)
}

// none records that a decision allowed through learnt nothing of Redis
// (its caller left first): half open, the next decision may try.
func (b *breaker) none() {
	if b == nil || b.st.Load() != halfOpen {
		return
	}
	b.mu.Lock()
	if b.st.Load() == halfOpen {
		b.trial = false
	}
	b.mu.Unlock()
}

// failedFor reports whether err is a failure for want of Redis.
func failedFor(err error) bool {
	return errors.Is(err, sluice.FailedBeforeSend) || errors.Is(err, sluice.ErrIndeterminate)
}

// node is one Redis the store sends decisions to: the store's only one,
// or one master of a Cluster, with its breaker, its senders and what its
// last round trip showed.
type node struct {
	addr    string                       // the master's address; "" for the store's own node
	client  atomic.Pointer[redis.Client] // the master's own client; nil: the store's Client
	breaker *breaker
	batch   *batcher // nil: every decision is sent alone by its caller
	errOpen error
	// last is the error of the newest round trip, nil when it succeeded
	// (or none ended yet); answered, whether one ever succeeded.
	last     atomic.Pointer[error]
	answered atomic.Bool
	gone     atomic.Bool // forgotten: its breaker's state no longer counts
}

// direct returns the client that reaches n alone: the master's own on a
// Cluster, the store's otherwise.
func (s *Store) direct(n *node) processPipeliner {
	if c := n.client.Load(); c != nil {
		return c
	}
	return s.client
}

// processPipeliner is what sends commands to one node.
type processPipeliner interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// newNode returns the node of the master at addr (c its client), or the
// store's own node when c is nil.
func (s *Store) newNode(addr string, c *redis.Client) *node {
	n := &node{addr: addr, errOpen: errOpen}
	if c != nil {
		n.client.Store(c)
		n.errOpen = fmt.Errorf("redisstore: Redis master %s is failing, not asked: %w", addr, sluice.CircuitOpen)
	}
	n.breaker = newBreaker(s.breakerOpts, func(ctx context.Context) error {
		ctx, cancel := s.callContext(ctx)
		defer cancel()
		err := s.direct(n).Process(ctx, onceCmd{redis.NewStatusCmd(ctx, "ping")})
		s.remember(n, err)
		if r, ok := s.client.(stateReloader); ok && !answers(err) {
			// Decisions for a master that does not answer are shed, so
			// none fails to make the cluster client look at its slot map
			// again: the probe does, and once a replica has taken the
			// master's slots, their decisions go to it.
			r.ReloadState(context.Background())
		}
		return err
	})
	if n.breaker != nil {
		n.breaker.trialFor = max(n.breaker.openFor, s.timeout)
		n.breaker.notify = func(state string, seq uint64) { s.changed(n, state, seq) }
		if c != nil {
			n.breaker.idle, n.breaker.idleAfter = func() { s.forget(n) }, nodeIdle
		}
	}
	if s.senders > 0 {
		n.batch = newBatcher(s, n, s.senders)
	}
	return n
}

// nodeIdle is how long a Cluster master's breaker stays open with no
// decision routed to it before the store forgets the node: its slots
// have moved to another master (a failover), or it left the cluster.
const nodeIdle = 30 * time.Second

// nodeFor returns the node a decision on key goes to: on a Cluster the
// master that owns key's slot (the store's own node, routed by the
// cluster client, while the slot map cannot be had).
func (s *Store) nodeFor(ctx context.Context, key []byte) *node {
	if s.cluster == nil || !s.one.breaker.closed() {
		return s.one
	}
	c, err := s.cluster.MasterForKey(ctx, string(key))
	if err != nil || c == nil {
		return s.one
	}
	return s.nodeOf(c)
}

// nodeOf returns the node of the Cluster master c, creating it the first
// time.
func (s *Store) nodeOf(c *redis.Client) *node {
	addr := c.Options().Addr
	if v, ok := s.nodes.Load(addr); ok {
		n := v.(*node)
		if n.client.Load() != c {
			n.client.Store(c) // the cluster client made a new one for the address
		}
		return n
	}
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if v, ok := s.nodes.Load(addr); ok {
		return v.(*node)
	}
	if s.closed {
		return s.one // its senders are closed: the decision fails before send
	}
	n := s.newNode(addr, c)
	s.nodes.Store(addr, n)
	return n
}

// forget drops a Cluster master's node that no decision asked for
// nodeIdle while its breaker was open. Called from its probe goroutine.
func (s *Store) forget(n *node) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if s.closed || !s.nodes.CompareAndDelete(n.addr, n) {
		return
	}
	n.gone.Store(true)
	s.changed(n, "", 0)
	if n.batch != nil {
		s.bg.Go(n.batch.close)
	}
}

// eachNode calls f for the store's own node and every master's.
func (s *Store) eachNode(f func(*node)) {
	f(s.one)
	s.nodes.Range(func(_, v any) bool { f(v.(*node)); return true })
}

// changed takes a node's new breaker state (seq orders its changes; ""
// when the node is forgotten) and reports the store's state, its worst
// node's, when that changes.
func (s *Store) changed(n *node, state string, seq uint64) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if state != "" && (seq <= s.seqs[n] || n.gone.Load()) {
		return // a late report of an older change, or of a forgotten node
	}
	s.seqs[n] = seq
	if state == "" || state == "closed" {
		delete(s.states, n)
		if state == "" {
			delete(s.seqs, n)
		}
	} else {
		s.states[n] = state
	}
	agg := "closed"
	for _, st := range s.states {
		if st == "open" {
			agg = "open"
			break
		}
		agg = "half_open"
	}
	if agg != s.state {
		s.state = agg
		if s.onChange != nil {
			s.onChange(agg)
		}
	}
}

// remember records on n how a round trip to it ended, for Ready.
func (s *Store) remember(n *node, err error) {
	if err == nil {
		if n.last.Load() != nil {
			n.last.Store(nil)
		}
		if !n.answered.Load() {
			n.answered.Store(true)
		}
		return
	}
	failed := err // taking err's own address would put it on the heap on every call
	n.last.Store(&failed)
}

// record tells n's breaker how a round trip begun with ctx ended: err is
// the error of (one of) its decisions, typed, nil when Redis answered
// them all. A caller that cancelled, or a context error returned without
// anything sent, shows nothing of Redis; a failure for want of Redis also
// makes a cluster client look at its slot map again (at most one reload
// at a time, 200ms apart: go-redis coalesces them), so a replica promoted
// in a dead master's place is found within one reload.
func (s *Store) record(ctx context.Context, n *node, err error) {
	failed := failedFor(err)
	switch {
	case failed && errors.Is(ctx.Err(), context.Canceled),
		!failed && err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		n.breaker.none()
		return
	}
	n.breaker.roundTrip(err)
	if failed {
		s.remember(n, err)
		if r, ok := s.client.(stateReloader); ok {
			r.ReloadState(context.Background())
		}
		return
	}
	s.remember(n, nil)
}

// stateReloader is a cluster client: it routes by a slot map of its own,
// which it refreshes on MOVED replies but not when a master it routes to
// is gone, so after a failover it would keep dialling the dead master for
// up to its ClusterStateReloadInterval (60s by default).
type stateReloader interface{ ReloadState(context.Context) }
