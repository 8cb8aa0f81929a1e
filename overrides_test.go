package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// evaluateOnly hides every method of a memstore but Evaluate: a Store
// that keeps no overrides.
type evaluateOnly struct{ s *memstore.Store }

func (e evaluateOnly) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	return e.s.Evaluate(ctx, ev)
}

func newOverrideLimiter(t *testing.T, store sluice.Store, opts sluice.Options) *sluice.Limiter {
	t.Helper()
	l, err := sluice.New(store, []sluice.Policy{
		{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
		{ID: "gcra", Algorithm: sluice.GCRA, Limit: 10, Window: time.Minute, Burst: 5},
		{ID: "conc", Algorithm: sluice.Concurrency, Limit: 3, LeaseTTL: time.Minute},
	}, opts)
	if err != nil {
		t.Fatalf("sluice.New: %v", err)
	}
	return l
}

// newMemstore returns a memstore on clock (nil: the real one), closed
// when tb ends.
func newMemstore(tb testing.TB, clock sluice.Clock) *memstore.Store {
	tb.Helper()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ms.Close() })
	return ms
}

func TestSetOverrideRejects(t *testing.T) {
	l := newOverrideLimiter(t, newMemstore(t, sluicetest.NewClock()), sluice.Options{})
	for _, c := range []struct {
		name string
		o    sluice.Override
		want string
	}{
		{"unknown policy", sluice.Override{Policy: "nope", Subject: "s", Limit: 5}, `policy "nope": unknown policy`},
		{"negative limit", sluice.Override{Policy: "fw", Subject: "s", Limit: -1}, "limit = -1: must be at least 1, or 0 to remove the override"},
		{"burst on fixed_window", sluice.Override{Policy: "fw", Subject: "s", Limit: 5, Burst: 7}, "burst = 7: applies only to token_bucket and gcra"},
		{"window too long", sluice.Override{Policy: "fw", Subject: "s", Limit: 5, Window: 366 * 24 * time.Hour}, "window = 8784h0m0s"},
		{"window on concurrency", sluice.Override{Policy: "conc", Subject: "s", Limit: 5, Window: time.Second}, "window = 1s: does not apply to concurrency"},
		{"burst on concurrency", sluice.Override{Policy: "conc", Subject: "s", Limit: 5, Burst: 5}, "burst = 5: does not apply to concurrency"},
		{"bad subject", sluice.Override{Policy: "fw", Subject: "a b", Limit: 5}, "subject byte 1"},
		{"empty subject on removal", sluice.Override{Policy: "fw"}, "subject is 0 bytes"},
	} {
		err := l.SetOverride(context.Background(), c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: SetOverride(%+v) = %v, want an error containing %q", c.name, c.o, err, c.want)
		}
	}
	if list, err := l.Overrides(context.Background()); err != nil || len(list) != 0 {
		t.Fatalf("Overrides after only rejected sets = %+v, %v; want none", list, err)
	}
}

// TestOverrideWithoutOverrideStore: a Store that keeps no overrides
// leaves them in the Limiter; Options.Overrides apply from the start and
// a SetOverride of the same policy and subject wins over them, on both
// Check paths.
func TestOverrideWithoutOverrideStore(t *testing.T) {
	store := evaluateOnly{newMemstore(t, sluicetest.NewClock())}
	opts := sluice.Options{Overrides: []sluice.Override{{Policy: "gcra", Subject: "tenant", Limit: 100, Burst: 50, Note: "config"}}}
	l := newOverrideLimiter(t, store, opts)
	ctx := context.Background()
	peek := func(req sluice.Request) sluice.Outcome {
		t.Helper()
		req.Op, req.Subject = sluice.Peek, "tenant"
		o := l.Check(ctx, req)
		if o.Kind != sluice.Allowed {
			t.Fatalf("Check(%+v) = %+v (err %v), want allowed", req, o, o.Err)
		}
		return o
	}
	if o := peek(sluice.Request{Policy: "gcra"}); o.Limit != 50 {
		t.Fatalf("one-policy peek under the config override: limit %d, want its burst 50", o.Limit)
	}
	if o := peek(sluice.Request{Policies: []string{"gcra", "fw"}}); o.Statuses[0].Limit != 50 || o.Statuses[1].Limit != 10 {
		t.Fatalf("two-policy peek: statuses %+v, want limits 50 and 10", o.Statuses)
	}
	if err := l.SetOverride(ctx, sluice.Override{Policy: "gcra", Subject: "tenant", Limit: 20, Burst: 20, Note: "api"}); err != nil {
		t.Fatal(err)
	}
	if o := peek(sluice.Request{Policy: "gcra"}); o.Limit != 20 {
		t.Fatalf("after SetOverride: limit %d, want 20", o.Limit)
	}
	list, err := l.Overrides(ctx)
	if err != nil || len(list) != 1 || list[0].Note != "api" {
		t.Fatalf("Overrides = %+v, %v; want the one set, which wins over the config's", list, err)
	}
	if err := l.SetOverride(ctx, sluice.Override{Policy: "gcra", Subject: "tenant"}); err != nil {
		t.Fatal(err)
	}
	if o := peek(sluice.Request{Policy: "gcra"}); o.Limit != 50 {
		t.Fatalf("after removing the set one: limit %d, want the config's 50 again", o.Limit)
	}
	if o := peek(sluice.Request{Policy: "conc"}); o.Limit != 3 {
		t.Fatalf("concurrency untouched: limit %d, want 3", o.Limit)
	}
}

func TestNewRejectsABadOverride(t *testing.T) {
	_, err := sluice.New(newMemstore(t, sluicetest.NewClock()), []sluice.Policy{{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute}},
		sluice.Options{Overrides: []sluice.Override{{Policy: "fw", Subject: "s", Limit: 5, Burst: 9}}})
	if err == nil || !strings.Contains(err.Error(), "sluice: New: overrides[0]: policy \"fw\": burst = 9") {
		t.Fatalf("New with a bad override = %v, want the overrides[0] error", err)
	}
}

func TestOverrideConcurrencyLimit(t *testing.T) {
	l := newOverrideLimiter(t, newMemstore(t, sluicetest.NewClock()), sluice.Options{})
	ctx := context.Background()
	if err := l.SetOverride(ctx, sluice.Override{Policy: "conc", Subject: "tenant", Limit: 1}); err != nil {
		t.Fatal(err)
	}
	if o := l.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "conc", Subject: "tenant"}); o.Kind != sluice.Allowed {
		t.Fatalf("first acquire = %+v (err %v), want allowed", o, o.Err)
	}
	if o := l.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "conc", Subject: "tenant"}); o.Kind != sluice.Denied {
		t.Fatalf("second acquire under a limit of 1 = %+v (err %v), want denied", o, o.Err)
	}
}

// BenchmarkCheckOverridden is BenchmarkCheck with every one of its
// subjects overridden (the same numbers again): the cost of looking the
// override up and deciding under it, beside BenchmarkCheck's none.
func BenchmarkCheckOverridden(b *testing.B) {
	l, subjects := newCheckBench(b, sluice.Options{})
	ctx := context.Background()
	for _, s := range subjects {
		if err := l.SetOverride(ctx, sluice.Override{Policy: "p", Subject: s, Limit: 1e9}); err != nil {
			b.Fatal(err)
		}
	}
	rng := uint64(0x9E3779B97F4A7C15)
	b.ReportAllocs()
	for b.Loop() {
		if o := l.Check(ctx, sluice.Request{Policy: "p", Subject: subjects[nextSubject(&rng)]}); o.Kind != sluice.Allowed {
			b.Fatalf("Check = %+v, want allowed", o)
		}
	}
}

// TestOverrideUnderAnOlderPseudonym: during a key rotation a request
// carries the subject's pseudonyms under older keys (Previous); an
// override set under one of them applies until the current pseudonym has
// one of its own, as the subject's state carries over.
func TestOverrideUnderAnOlderPseudonym(t *testing.T) {
	ctx := context.Background()
	l := newOverrideLimiter(t, newMemstore(t, sluicetest.NewClock()), sluice.Options{})
	if err := l.SetOverride(ctx, sluice.Override{Policy: "fw", Subject: "k1:acme", Limit: 100}); err != nil {
		t.Fatal(err)
	}
	rotated := sluice.Request{Policy: "fw", Subject: "k2:acme", Previous: []string{"k1:acme"}}
	if o := l.Check(ctx, rotated); !o.Allowed || o.Limit != 100 {
		t.Fatalf("after the rotation = %+v, want the plan of the older pseudonym (limit 100)", o)
	}
	if err := l.SetOverride(ctx, sluice.Override{Policy: "fw", Subject: "k2:acme", Limit: 20}); err != nil {
		t.Fatal(err)
	}
	if o := l.Check(ctx, rotated); o.Limit != 20 {
		t.Fatalf("with a plan of its own = %+v, want the current pseudonym's (limit 20)", o)
	}
	if o := l.Check(ctx, sluice.Request{Policy: "fw", Subject: "k2:other", Previous: []string{"k1:other"}}); o.Limit != 10 {
		t.Fatalf("another subject = %+v, want the policy's own limit 10", o)
	}
}

// timerClock is a sluicetest.Clock that also runs functions after a
// while on itself (as internal/clock's clocks do on the real time): due
// ones run on Advance.
type timerClock struct {
	*sluicetest.Clock
	mu     sync.Mutex
	timers []clockTimer
}

type clockTimer struct {
	at time.Time
	f  func()
}

func (c *timerClock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	c.timers = append(c.timers, clockTimer{c.Now().Add(d), f})
	c.mu.Unlock()
}

func (c *timerClock) Advance(d time.Duration) {
	c.Clock.Advance(d)
	c.mu.Lock()
	var due []func()
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.Now()) {
			kept = append(kept, t)
		} else {
			due = append(due, t.f)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// TestOverridesNeverStale: two Limiters share a memstore (two servers on
// one Redis); a plan changed through one is applied by the other's first
// decision after it was idle past the bound, on a clock that only moves
// by hand: no decision is taken on overrides read longer ago than 500ms.
// Within the bound, the overrides read may still be used. Both with a
// clock the Limiter must read and one that runs timers.
func TestOverridesNeverStale(t *testing.T) {
	for _, c := range []struct {
		name  string
		clock interface {
			sluice.Clock
			Advance(time.Duration)
		}
	}{
		{"read", sluicetest.NewClock()},
		{"timers", &timerClock{Clock: sluicetest.NewClock()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ms := newMemstore(t, c.clock)
			policies := []sluice.Policy{{ID: "api", Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Minute}}
			var lims [2]*sluice.Limiter
			for i := range lims {
				l, err := sluice.New(ms, policies, sluice.Options{Clock: c.clock})
				if err != nil {
					t.Fatal(err)
				}
				lims[i] = l
			}
			ctx := context.Background()
			req := sluice.Request{Policy: "api", Subject: "tenant"}
			if o := lims[1].Check(ctx, req); o.Limit != 3 {
				t.Fatalf("Check before any override = %+v, want limit 3", o)
			}
			for _, step := range []struct {
				limit, want int64
				idle        time.Duration
			}{
				{10, 10, 600 * time.Millisecond},
				{5, 5, 501 * time.Millisecond},
				{20, 5, 100 * time.Millisecond}, // within the bound: the plan read may still hold
				{20, 20, 500 * time.Millisecond},
			} {
				if err := lims[0].SetOverride(ctx, sluice.Override{Policy: "api", Subject: "tenant", Limit: step.limit}); err != nil {
					t.Fatal(err)
				}
				c.clock.Advance(step.idle)
				if o := lims[1].Check(ctx, req); o.Limit != step.want {
					t.Fatalf("Check(%q) after a plan of %d set elsewhere and %v idle = limit %d (%+v), want %d", req.Subject, step.limit, step.idle, o.Limit, o, step.want)
				}
			}
		})
	}
}

// badOverrides is a memstore whose overrides read holds, beside its own,
// ones no Limiter can apply: a policy it lacks, numbers its rules refuse.
type badOverrides struct{ *memstore.Store }

func (s badOverrides) Overrides(ctx context.Context) ([]sluice.Override, error) {
	list, err := s.Store.Overrides(ctx)
	bad := []sluice.Override{{Policy: "gone", Subject: "tenant", Limit: 5}, {Policy: "fw", Subject: "other", Limit: 5, Burst: 9}, {Policy: "fw", Subject: "a b", Limit: 5}}
	return append(bad, list...), err
}

// TestOverridesSkipWhatCannotApply: overrides the store holds that the
// Limiter cannot apply are skipped; the rest apply.
func TestOverridesSkipWhatCannotApply(t *testing.T) {
	clock := sluicetest.NewClock()
	store := badOverrides{newMemstore(t, clock)}
	if err := store.PutOverride(context.Background(), sluice.Override{Policy: "fw", Subject: "tenant", Limit: 2}); err != nil {
		t.Fatal(err)
	}
	l := newOverrideLimiter(t, store, sluice.Options{Clock: clock})
	if o := l.Check(context.Background(), sluice.Request{Policy: "fw", Subject: "tenant"}); o.Limit != 2 {
		t.Fatalf("Check = %+v, want the stored override's limit 2", o)
	}
}

// failingOverrides is a memstore whose overrides read fails, or hangs
// until released, when told to.
type failingOverrides struct {
	*memstore.Store
	fail, hang atomic.Bool
	release    chan struct{}
}

func (s *failingOverrides) Overrides(ctx context.Context) ([]sluice.Override, error) {
	if s.hang.Load() {
		<-s.release
	}
	if s.fail.Load() {
		return nil, errors.New("overrides unreadable")
	}
	return s.Store.Overrides(ctx)
}

// TestOverridesReadFailing: a Check that finds the overrides stale waits
// for one read; when that read fails it decides on the overrides it had.
// A failed read does not make them fresh: once the store answers again,
// no decision is taken on overrides read longer than the bound (500ms)
// ago. A plan of 5 stored by another instance after the store came back
// applies to every Check 500ms later: the first, then 39 at once, of
// which 2 are admitted (3 spent before), none on the old plan of 40.
func TestOverridesReadFailing(t *testing.T) {
	clock := sluicetest.NewClock()
	store := &failingOverrides{Store: newMemstore(t, clock), release: make(chan struct{})}
	defer close(store.release)
	ctx := context.Background()
	if err := store.PutOverride(ctx, sluice.Override{Policy: "fw", Subject: "tenant", Limit: 40}); err != nil {
		t.Fatal(err)
	}
	l := newOverrideLimiter(t, store, sluice.Options{Clock: clock})
	req := sluice.Request{Policy: "fw", Subject: "tenant"}
	if o := l.Check(ctx, req); o.Limit != 40 {
		t.Fatalf("Check = %+v, want limit 40", o)
	}
	store.fail.Store(true)
	clock.Advance(600 * time.Millisecond)
	if o := l.Check(ctx, req); o.Kind != sluice.Allowed || o.Limit != 40 {
		t.Fatalf("Check after a failed read = %+v, want allowed on the overrides read before (limit 40)", o)
	}
	store.fail.Store(false)
	if err := store.PutOverride(ctx, sluice.Override{Policy: "fw", Subject: "tenant", Limit: 5}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(500 * time.Millisecond)
	if o := l.Check(ctx, req); o.Limit != 5 {
		t.Fatalf("Check 500ms after a plan of 5 was stored, the store answering again after a failed read = %+v, want limit 5", o)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 39 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := l.Check(ctx, req)
			if o.Limit != 5 {
				t.Errorf("concurrent Check = %+v, want limit 5", o)
			}
			if o.Kind == sluice.Allowed {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 2 {
		t.Fatalf("39 concurrent Checks on a plan of 5 with 3 spent: %d admitted, want 2", got)
	}
}

// TestOverridesReadHungAtStart: when the store's overrides read hangs, a
// Check waits for it half the time its context has left, then decides on
// the overrides in hand: the store's answer, not a deadline spent waiting
// (with a failing store, that answer is what feeds its breaker).
func TestOverridesReadHungAtStart(t *testing.T) {
	store := &failingOverrides{Store: newMemstore(t, nil), release: make(chan struct{})}
	defer close(store.release)
	store.hang.Store(true)
	l := newOverrideLimiter(t, store, sluice.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if o := l.Check(ctx, sluice.Request{Policy: "fw", Subject: "tenant"}); o.Kind != sluice.Allowed || ctx.Err() != nil {
		t.Fatalf("Check while the overrides read hangs = %+v (context: %v), want allowed by the store within the deadline", o, ctx.Err())
	}
}

// BenchmarkSetOverride10000 sets one override on a Limiter that applies
// 10 000 (over a store that keeps none): what an admin API call or a
// plan change costs once a fleet of tenants has overrides.
func BenchmarkSetOverride10000(b *testing.B) {
	l, err := sluice.New(evaluateOnly{newMemstore(b, nil)}, []sluice.Policy{{ID: "p", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second}}, sluice.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := range 10_000 {
		if err := l.SetOverride(ctx, sluice.Override{Policy: "p", Subject: fmt.Sprintf("tenant-%d", i), Limit: 1000}); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if err := l.SetOverride(ctx, sluice.Override{Policy: "p", Subject: fmt.Sprintf("tenant-%d", i%10_000), Limit: int64(1000 + i%2)}); err != nil {
			b.Fatal(err)
		}
	}
}
