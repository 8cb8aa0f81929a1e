package sluice_test

import (
	"context"
	"strings"
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
		{"window too long", sluice.Override{Policy: "fw", Subject: "s", Limit: 5, Window: 48 * time.Hour}, "window = 48h0m0s"},
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
