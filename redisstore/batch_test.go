package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// roundTrips is a go-redis hook that counts the store's round trips: each
// single command and each pipeline, with the number of decisions each
// pipeline carried.
type roundTrips struct {
	mu        sync.Mutex
	singles   int
	pipelines []int
	shared    int           // decideAll calls among them
	sent      chan struct{} // a decision went on the wire
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" {
			h.mu.Lock()
			h.singles++
			h.mu.Unlock()
			select {
			case h.sent <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			n += decisions(cmd)
			if name, _ := cmd.Args()[1].(string); cmd.Name() == "fcall" && strings.HasSuffix(name, "_all") {
				h.mu.Lock()
				h.shared++
				h.mu.Unlock()
			}
		}
		if n > 0 { // not go-redis's own connection set-up
			h.mu.Lock()
			h.pipelines = append(h.pipelines, n)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// decisions returns how many decisions cmd takes: one for an FCALL of the
// decision function, their number for a call of its decideAll twin
// (FCALL <name>_all numkeys keys… m …), none for any other command.
func decisions(cmd redis.Cmder) int {
	args := cmd.Args()
	if cmd.Name() != "fcall" || len(args) < 3 {
		return 0
	}
	if name, _ := args[1].(string); !strings.HasSuffix(name, "_all") {
		return 1
	}
	keys, _ := args[2].(int)
	m, _ := args[3+keys].(int)
	return m
}

// queueingStore returns a Redis server of the test's own, its client
// with roundTrips counting, and a store on it with one sender (so that
// what arrives while a decision is on the wire queues behind it).
func queueingStore(t *testing.T) (*redistest.Server, *redis.Client, *roundTrips, *redisstore.Store) {
	t.Helper()
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	hook := &roundTrips{sent: make(chan struct{}, 1)}
	c.AddHook(hook)
	s := newStore(t, c, redisstore.Options{Senders: 1, Timeout: 30 * time.Second})
	waitReady(t, s) // the code loaded: the first decision is not sent twice
	return srv, c, hook, s
}

// waitQueued waits until n decisions wait behind the one holdWire put on
// the wire: queued, or in a round trip a sender began (Redis paused, it
// cannot end).
func waitQueued(t *testing.T, s *redisstore.Store, hook *roundTrips, n int) {
	t.Helper()
	got := 0
	for range 1000 { // polled: a queue's length is the event, 10s at most
		hook.mu.Lock()
		onWire := hook.singles - 1 // holdWire's
		for _, k := range hook.pipelines {
			onWire += k
		}
		hook.mu.Unlock()
		if got = s.Queued() + onWire; got >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d of %d decisions queued behind the one on the wire after 10s", got, n)
}

// holdWire pauses srv and sends one decision of subj on p with s, returning once
// it is on the wire (Redis not answering, so what follows queues behind
// it), and a func that resumes Redis and returns that decision's error.
// Redis is resumed at the end of the test whatever happens.
func holdWire(t *testing.T, srv *redistest.Server, hook *roundTrips, s *redisstore.Store, subj string, p *sluice.Policy) (resume func() error) {
	t.Helper()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Resume()
		}
	})
	first := make(chan error, 1)
	go func() {
		st, err := evaluate(context.Background(), s, subj, 1, p)
		if err == nil && !st[0].Allowed {
			err = fmt.Errorf("the decision on the wire = %+v, want allowed", st)
		}
		first <- err
	}()
	<-hook.sent
	return func() error {
		if err := srv.Resume(); err != nil {
			return err
		}
		resumed = true
		return <-first
	}
}

// TestDecisionsShareRoundTrips: a decision that finds the sender idle goes
// alone, at once; the decisions that arrive while it is on the wire go
// together in one round trip, each with its own answer. Redis is paused so
// the first decision stays on the wire while the others queue.
func TestDecisionsShareRoundTrips(t *testing.T) {
	srv, _, hook, s := queueingStore(t)
	const queued = 50
	p := policy(t, "batch", sluice.FixedWindow, queued, time.Minute)
	ctx := context.Background()
	subj := subject(t)

	resume := holdWire(t, srv, hook, s, subj, p) // spends one of the limit
	var wg sync.WaitGroup
	var allowed atomic.Int64
	remaining := make([]int64, queued)
	for i := range queued {
		wg.Go(func() {
			st, err := evaluate(ctx, s, subj, 1, p)
			if err != nil {
				t.Error(err)
				return
			}
			if st[0].Allowed {
				allowed.Add(1)
			}
			remaining[i] = st[0].Remaining
		})
	}
	// They cannot all be sent before Redis answers the first decision:
	// with one sender, at most one round trip more is on the wire.
	waitQueued(t, s, hook, queued)
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := allowed.Load(); n != queued-1 {
		t.Fatalf("%d of the %d queued decisions allowed, want %d: a limit of %d, one spent first", n, queued, queued-1, queued)
	}
	seen := map[int64]bool{}
	for _, r := range remaining {
		if seen[r] && r != 0 {
			t.Fatalf("two decisions answered remaining %d: each must get its own reply (%v)", r, remaining)
		}
		seen[r] = true
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	total := hook.singles
	for _, n := range hook.pipelines {
		total += n
	}
	if total != queued+1 || hook.singles+len(hook.pipelines) > 3 {
		t.Fatalf("round trips: %d single, pipelines %v; want the %d decisions in about two round trips", hook.singles, hook.pipelines, queued+1)
	}
	t.Logf("round trips: %d single, pipelines of %v", hook.singles, hook.pipelines)
}

// TestSharedRunKeepsEachAnswer: decisions by one spec queued in order
// behind one on the wire go to Redis as one run of a decideAll call
// (specRun, fixedWindowFloor for a fixed window on Redis time): corrupt
// state in the middle of the run fails its own decision only, and the
// decisions before and after it are decided as alone, the denied one
// included.
func TestSharedRunKeepsEachAnswer(t *testing.T) {
	srv, c, hook, s := queueingStore(t)
	ctx := context.Background()
	fw := policy(t, "run-fw", sluice.FixedWindow, 3, time.Minute)
	a, corrupt, b := subject(t), subject(t), subject(t)
	if err := c.Set(ctx, s.Key(corrupt, fw), "not a state", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	resume := holdWire(t, srv, hook, s, subject(t), fw)
	type answer struct {
		st  []sluice.Status
		err error
	}
	var answers []chan answer
	// (The first may go alone once Redis answers: the run still holds a
	// decision before the corrupt one.)
	for i, subj := range []string{a, a, corrupt, a, a, b} {
		ch := make(chan answer, 1)
		go func() {
			st, err := evaluate(ctx, s, subj, 1, fw)
			ch <- answer{st, err}
		}()
		answers = append(answers, ch)
		waitQueued(t, s, hook, 1+i) // queued in this order
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		corrupt   bool
		allowed   bool
		remaining int64
	}{{false, true, 2}, {false, true, 1}, {true, false, 0}, {false, true, 0}, {false, false, 0}, {false, true, 2}} {
		got := <-answers[i]
		switch {
		case want.corrupt:
			if !errors.Is(got.err, sluice.CorruptState) {
				t.Errorf("decision %d, on corrupt state = %+v, %v; want CorruptState", i, got.st, got.err)
			}
		case got.err != nil || got.st[0].Allowed != want.allowed || got.st[0].Remaining != want.remaining:
			t.Errorf("decision %d = %+v, %v; want allowed %v, %d remaining", i, got.st, got.err, want.allowed, want.remaining)
		case !want.allowed && got.st[0].RetryAfter <= 0:
			t.Errorf("decision %d, denied = %+v; want a retry wait", i, got.st)
		}
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.shared == 0 {
		t.Errorf("round trips: %d single, pipelines %v, no decideAll call; want the queued decisions in one", hook.singles, hook.pipelines)
	}
}

// TestSharedCallKeepsEachAnswer: decisions queued behind one on the wire
// reach one Redis in a single decideAll call, and each keeps its own
// answer there: corrupt state fails its own decision only (CorruptState),
// a request the script refuses its own (ErrInvalidRequest), a decision with an evaluation
// id is remembered (its repeat is Replayed, nothing spent), a multi-policy
// decision stays all or nothing, a held spend keeps its hold, and the
// others are decided as alone.
func TestSharedCallKeepsEachAnswer(t *testing.T) {
	srv, c, hook, s := queueingStore(t)
	ctx := context.Background()
	gcra := policy(t, "shared-gcra", sluice.GCRA, 3, time.Minute)
	logp := policy(t, "shared-log", sluice.SlidingLog, 1, time.Minute)
	fw := policy(t, "shared-fw", sluice.FixedWindow, 5, time.Minute)
	sw := policy(t, "shared-sw", sluice.SlidingWindow, 5, time.Minute)
	corrupt, busy, idSubj, multi := subject(t), subject(t), subject(t), subject(t)
	if err := c.Set(ctx, s.Key(corrupt, gcra), "not a state", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	mustEvaluate(t, s, multi, 1, logp) // the log is full: multi's decision must spend nothing
	if err := s.Evaluate(ctx, &sluice.Evaluation{Subject: busy, Policies: []*sluice.Policy{fw}, Cost: 1, EvaluationID: "mixed"}); err != nil {
		t.Fatal(err)
	}

	resume := holdWire(t, srv, hook, s, subject(t), fw)

	type answer struct {
		st  []sluice.Status
		err error
		ev  *sluice.Evaluation
	}
	run := func(ev *sluice.Evaluation) chan answer {
		ch := make(chan answer, 1)
		go func() { err := s.Evaluate(ctx, formed(ev, false)); ch <- answer{ev.Statuses, err, ev} }()
		return ch
	}
	var busyAnswers []chan answer
	for range 5 {
		busyAnswers = append(busyAnswers, run(&sluice.Evaluation{Subject: busy, Policies: []*sluice.Policy{gcra}, Cost: 1}))
	}
	corruptAnswer := run(&sluice.Evaluation{Subject: corrupt, Policies: []*sluice.Policy{gcra}, Cost: 1})
	badAnswer := run(&sluice.Evaluation{Subject: busy, Policies: []*sluice.Policy{fw, sw}, Cost: 1, EvaluationID: "mixed"}) // first used with one policy: the script refuses it
	idAnswer := run(&sluice.Evaluation{Subject: idSubj, Policies: []*sluice.Policy{fw}, Cost: 2, EvaluationID: "job-1"})
	multiAnswer := run(&sluice.Evaluation{Subject: multi, Policies: []*sluice.Policy{fw, logp}, Cost: 1})
	// Held for one emission interval: the floor takes one unit beside the spend's.
	heldAnswer := run(&sluice.Evaluation{Subject: subject(t), Policies: []*sluice.Policy{gcra}, Cost: 1, Hold: 20 * time.Second})
	waitQueued(t, s, hook, 10) // 5 busy, corrupt, bad, id, multi, held
	if err := resume(); err != nil {
		t.Fatal(err)
	}

	allowed := 0
	for _, ch := range busyAnswers {
		a := <-ch
		if a.err != nil {
			t.Fatalf("decision on a healthy subject beside a corrupt one: %v", a.err)
		}
		if a.st[0].Allowed {
			allowed++
		}
	}
	if allowed != 3 {
		t.Errorf("%d of 5 decisions of a gcra limit of 3 allowed, want 3", allowed)
	}
	if a := <-corruptAnswer; !errors.Is(a.err, sluice.CorruptState) {
		t.Errorf("decision on corrupt state = %+v, %v; want CorruptState", a.st, a.err)
	}
	if a := <-badAnswer; !errors.Is(a.err, sluice.ErrInvalidRequest) {
		t.Errorf("an evaluation id reused with another number of policies = %+v, %v; want ErrInvalidRequest", a.st, a.err)
	}
	a := <-idAnswer
	if a.err != nil || !a.st[0].Allowed || a.st[0].Remaining != 3 || a.ev.Replayed {
		t.Fatalf("decision with an id = %+v, %v (replayed %v); want allowed, 3 remaining, not replayed", a.st, a.err, a.ev.Replayed)
	}
	again := &sluice.Evaluation{Subject: idSubj, Policies: []*sluice.Policy{fw}, Cost: 2, EvaluationID: "job-1"}
	if err := s.Evaluate(ctx, again); err != nil || !again.Replayed || again.Statuses[0].Remaining != 3 {
		t.Errorf("repeat of the id = %+v, %v (replayed %v); want the first decision replayed", again.Statuses, err, again.Replayed)
	}
	if a := <-multiAnswer; a.err != nil || a.st[1].Allowed || a.st[0].Remaining != 5 {
		t.Errorf("two policies, the second exhausted = %+v, %v; want denied by the second, the first unspent", a.st, a.err)
	}
	if a := <-heldAnswer; a.err != nil || !a.st[0].Allowed || a.st[0].Remaining != 1 {
		t.Errorf("gcra 3/min held for 20s, cost 1 = %+v, %v; want allowed, 1 remaining", a.st, a.err)
	}
	if st := mustEvaluate(t, s, multi, 0, fw); st[0].Remaining != 5 {
		t.Errorf("fixed window after a denied multi-policy decision: %d remaining, want 5 (nothing spent)", st[0].Remaining)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.shared == 0 {
		t.Errorf("round trips: %d single, pipelines %v, no decideAll call; want the queued decisions in one", hook.singles, hook.pipelines)
	}
}

// TestLostBatchIsReplayed: decisions whose replies are lost, alone or in a
// pipeline, are each Indeterminate (or failed before send, when their
// connection could not even be set up); retried with their evaluation ids,
// those that ran get their first decisions back and the others are decided
// now, so each job is spent exactly once: the limit of 20 admits all 20
// retries and nothing more.
func TestLostBatchIsReplayed(t *testing.T) {
	standaloneClient(t)
	proxy := newBlackholeProxy(t, shared.standalone.Addr)
	pc := redis.NewClient(&redis.Options{Addr: proxy.addr, ContextTimeoutEnabled: true, MaxRetries: 3})
	defer pc.Close()
	// No breaker: twenty lost replies in a row would open it, and this
	// test is about what the retries get.
	s := newStore(t, pc, redisstore.Options{Timeout: 2 * time.Second, Senders: 1, Breaker: redisstore.BreakerOptions{Failures: -1}})
	const n = 20
	p := policy(t, "lostbatch", sluice.SlidingLog, n, time.Minute)
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	subj := subject(t)
	check := func(i int) sluice.Outcome {
		return l.Check(context.Background(), sluice.Request{Policy: "lostbatch", Subject: subj, EvaluationID: fmt.Sprint("job-", i)})
	}
	if o := l.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "lostbatch", Subject: subj}); o.Kind != sluice.Allowed {
		t.Fatalf("warm-up peek = %+v", o)
	}
	proxy.dropReplies.Store(true)
	outcomes := make([]sluice.Outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { outcomes[i] = check(i) })
	}
	wg.Wait()
	proxy.dropReplies.Store(false)
	for i, o := range outcomes {
		// Indeterminate when it was written; a decision whose new
		// connection could not be set up (its replies dropped too) was
		// never sent: Unavailable, failed before send.
		if o.Kind != sluice.Indeterminate && (o.Kind != sluice.Unavailable || o.Cause != sluice.FailedBeforeSend) {
			t.Fatalf("decision %d with its reply lost = %+v, want Indeterminate or failed before send", i, o)
		}
	}
	replayed := 0
	for i := range n {
		o := check(i)
		if o.Kind != sluice.Allowed {
			t.Fatalf("retry of decision %d = %+v, want allowed: a job spent twice would exhaust the limit", i, o)
		}
		if o.Replayed {
			replayed++
		}
	}
	t.Logf("%d of %d retries replayed a decision Redis had taken; the rest had not reached it", replayed, n)
	if o := l.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "lostbatch", Subject: subj}); o.Remaining != 0 {
		t.Fatalf("remaining after %d lost and replayed decisions = %d, want 0: each spent once", n, o.Remaining)
	}
}

// TestLazyStartsWithRedisDown: New builds a store while Redis is down,
// without an error; its decisions fail before send (nothing spent) with
// the client's error naming the refused address, and it is not Ready,
// for the same reason; once Redis is back on that port, the first
// decision loads the code and is decided.
func TestLazyStartsWithRedisDown(t *testing.T) {
	srv, err := redistest.StartServer("")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	srv.Kill()
	c := srv.Client()
	defer c.Close()
	s := newStore(t, c, redisstore.Options{Timeout: 2 * time.Second})
	p := policy(t, "lazy", sluice.GCRA, 3, time.Minute)
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	subj := subject(t)
	refused := "dial tcp " + srv.Addr + ": connect: connection refused"
	if o := l.Check(ctx, sluice.Request{Policy: "lazy", Subject: subj}); o.Kind != sluice.Unavailable || o.Cause != sluice.FailedBeforeSend || !strings.Contains(fmt.Sprint(o.Err), refused) {
		t.Fatalf("Check with Redis down = %+v, want Unavailable, failed before send, with an error saying %q", o, refused)
	}
	for range 20 { // bounded: Ready waits 50ms at most for the check it starts
		if err = s.Ready(ctx); err != nil && strings.Contains(err.Error(), refused) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), refused) || !strings.Contains(err.Error(), "nothing sent") {
		t.Fatalf("Ready with Redis down = %v, want an error saying nothing was sent: %q", err, refused)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// go-redis dials again on its own schedule: ask until it does, a
	// bounded number of times.
	var o sluice.Outcome
	for range 100 {
		if o = l.Check(ctx, sluice.Request{Policy: "lazy", Subject: subj}); o.Kind != sluice.Unavailable {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if o.Kind != sluice.Allowed || o.Remaining != 2 {
		t.Fatalf("Check once Redis is back = %+v (err %v), want allowed with 2 left: nothing was spent while it was down", o, o.Err)
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("Ready once Redis is back = %v", err)
	}
}

// TestBreakerShedsWhileRedisHangs: with Redis hung (SIGSTOP), the first
// decisions wait out their deadline; then the breaker opens and the next
// ones fail at once with CircuitOpen, nothing sent; once Redis answers
// again, one probe closes it and decisions are taken again.
func TestBreakerShedsWhileRedisHangs(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	var mu sync.Mutex
	var states []string
	s := newStore(t, c, redisstore.Options{Timeout: 200 * time.Millisecond, Breaker: redisstore.BreakerOptions{
		Failures: 3,
		OpenFor:  100 * time.Millisecond,
		OnChange: func(state string) { mu.Lock(); states = append(states, state); mu.Unlock() },
	}})
	p := policy(t, "breaker", sluice.FixedWindow, 100, time.Hour)
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	subj := subject(t)
	if o := l.Check(ctx, sluice.Request{Policy: "breaker", Subject: subj}); o.Kind != sluice.Allowed {
		t.Fatalf("warm-up = %+v", o)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for range 8 {
		o := l.Check(ctx, sluice.Request{Policy: "breaker", Subject: subj})
		kinds = append(kinds, o.Kind.String()+"/"+o.Cause.String())
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The first ones wait out the store's timeout: Indeterminate when the
	// command was written, FailedBeforeSend when a new connection could
	// not even be set up; then the breaker sheds. The Limiter's reads of
	// the plans (in the background once they are old, or a check's own
	// once they are stale after a failed read) count towards the three
	// failures too, so one to three checks fail before it opens.
	opened := slices.Index(kinds, "unavailable/circuit_open")
	for i, k := range kinds {
		failed := k == "indeterminate/" || k == "unavailable/failed_before_send"
		if opened < 1 || opened > 3 || i < opened && !failed || i >= opened && k != "unavailable/circuit_open" {
			t.Fatalf("8 checks against a hung Redis = %v: want one to three failures for want of Redis (the plans' reads count too), then circuit_open", kinds)
		}
	}
	var o sluice.Outcome
	for range 100 { // until OpenFor has passed and the probe went through
		if o = l.Check(ctx, sluice.Request{Policy: "breaker", Subject: subj}); o.Cause != sluice.CircuitOpen {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if o.Kind != sluice.Allowed {
		t.Fatalf("check once Redis answers again = %+v (err %v), want allowed", o, o.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(states) != "[open half_open closed]" {
		t.Fatalf("breaker states %v, want [open half_open closed]", states)
	}
}

// TestReadyTellsTheTruth: a Redis out of memory for writes, or read-only
// (a replica), is not ready, and a decision there is Unavailable (Redis
// refused it before it ran: nothing spent), its error code kept through
// the script; both recover when Redis does.
func TestReadyTellsTheTruth(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	s := newStore(t, c, redisstore.Options{Breaker: redisstore.BreakerOptions{Failures: -1}})
	p := policy(t, "truth", sluice.TokenBucket, 5, time.Minute)
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	subj := subject(t)
	check := func(what string, want sluice.Kind, code string) {
		t.Helper()
		o := l.Check(ctx, sluice.Request{Policy: "truth", Subject: subj})
		if o.Kind != want || code != "" && (o.Cause != sluice.FailedBeforeSend || !strings.Contains(fmt.Sprint(o.Err), code)) {
			t.Fatalf("%s: Check = %+v (err %v), want %v %s", what, o, o.Err, want, code)
		}
	}
	for _, fault := range []struct {
		name, code   string
		break_, heal func() error
	}{
		{"out of memory", "OOM",
			func() error { return c.ConfigSet(ctx, "maxmemory", "1").Err() },
			func() error { return c.ConfigSet(ctx, "maxmemory", "0").Err() }},
		{"read-only replica", "READONLY",
			func() error { return c.Do(ctx, "replicaof", "127.0.0.1", "1").Err() },
			func() error { return c.Do(ctx, "replicaof", "no", "one").Err() }},
	} {
		check("before "+fault.name, sluice.Allowed, "")
		if err := fault.break_(); err != nil {
			t.Fatal(err)
		}
		readyAnswers(t, s, "when "+fault.name, fault.code)
		check("when "+fault.name, sluice.Unavailable, fault.code)
		if err := fault.heal(); err != nil {
			t.Fatal(err)
		}
		readyAnswers(t, s, "after "+fault.name, "")
	}
	check("after both", sluice.Allowed, "")
	if o := l.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: "truth", Subject: subj}); o.Remaining != 2 {
		t.Fatalf("remaining after 3 allowed decisions and 2 refused = %d, want 2: a refused decision spends nothing", o.Remaining)
	}
}

// readyAnswers waits for the answer of the readiness check that Ready
// starts: Ready waits for it at most 50ms and otherwise answers from the
// last one (on a loaded machine, the one before the fault), so it is
// asked again, which waits on the same check, until it says want (an
// error holding want; "" for ready), 200 times at most (10s).
func readyAnswers(t *testing.T, s *redisstore.Store, what, want string) {
	t.Helper()
	var err error
	for range 200 {
		err = s.Ready(context.Background())
		if want == "" && err == nil || want != "" && err != nil && strings.Contains(err.Error(), want) {
			return
		}
	}
	t.Fatalf("Ready %s = %v, want %q (\"\" for ready), 200 times", what, err, want)
}

// TestNearCacheCutsRedisCalls: a flood of 100 × the limit on one subject
// with NearCache reaches Redis for the admissions and the first denial
// only (INFO commandstats), and admits exactly the limit.
func TestNearCacheCutsRedisCalls(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	s := newStore(t, c, redisstore.Options{})
	l, err := sluice.New(s, []sluice.Policy{{ID: "flood", Algorithm: sluice.GCRA, Limit: 10, Window: time.Hour, NearCache: true}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for range 1000 {
		if o := l.Check(ctx, sluice.Request{Policy: "flood", Subject: "mallory"}); o.Kind == sluice.Allowed {
			allowed++
		}
	}
	stats, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	for _, line := range strings.Split(stats, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:calls="); ok {
			fmt.Sscanf(rest, "%d", &calls)
		}
	}
	if allowed != 10 || calls > 100 {
		t.Fatalf("1000 requests, limit 10: %d admitted, %d FCALLs; want 10 admitted and at most 100 calls (a 90%% cut)", allowed, calls)
	}
	t.Logf("1000 requests, limit 10: %d admitted, %d FCALLs reached Redis", allowed, calls)
}
