package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// countingStore is a real memstore that counts the calls reaching it, to
// prove which requests Limiter answers without touching the store.
type countingStore struct {
	*memstore.Store
	calls atomic.Int64
}

func (s *countingStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	s.calls.Add(1)
	return s.Store.Evaluate(ctx, ev)
}

func newLimiter(t *testing.T) (*sluice.Limiter, *countingStore, *sluicetest.Clock) {
	t.Helper()
	clock := sluicetest.NewClock()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	store := &countingStore{Store: ms}
	l, err := sluice.New(store, []sluice.Policy{
		{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
		{ID: "day", Algorithm: sluice.SlidingWindow, Limit: 1000, Window: 24 * time.Hour, MaxCost: 50},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l, store, clock
}

func TestCheckRejectsBeforeTheStore(t *testing.T) {
	l, store, _ := newLimiter(t)
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	cases := []struct {
		name  string
		ctx   context.Context
		req   sluice.Request
		kind  sluice.Kind
		cause sluice.Cause
		err   error
	}{
		{"deadline passed", expired, sluice.Request{Policy: "demo", Subject: "s"}, sluice.Unavailable, sluice.DeadlinePassed, context.DeadlineExceeded},
		{"cancelled", cancelled, sluice.Request{Policy: "demo", Subject: "s"}, sluice.Unavailable, sluice.DeadlinePassed, context.Canceled},
		{"unknown policy", context.Background(), sluice.Request{Policy: "nope", Subject: "s"}, sluice.Incompatible, 0, policyerr.ErrUnknownPolicy},
		{"unknown among several", context.Background(), sluice.Request{Policies: []string{"demo", "nope"}, Subject: "s"}, sluice.Incompatible, 0, policyerr.ErrUnknownPolicy},
		{"no policy", context.Background(), sluice.Request{Subject: "s"}, sluice.Incompatible, 0, sluice.ErrInvalidRequest},
		{"policy and policies", context.Background(), sluice.Request{Policy: "demo", Policies: []string{"day"}, Subject: "s"}, sluice.Incompatible, 0, sluice.ErrInvalidRequest},
		{"policy named twice", context.Background(), sluice.Request{Policies: []string{"demo", "demo"}, Subject: "s"}, sluice.Incompatible, 0, sluice.ErrInvalidRequest},
		{"empty subject", context.Background(), sluice.Request{Policy: "demo"}, sluice.Incompatible, 0, sluice.ErrInvalidRequest},
		{"subject with a hash tag", context.Background(), sluice.Request{Policy: "demo", Subject: "a{b}"}, sluice.Incompatible, 0, sluice.ErrInvalidRequest},
		{"subject with a space", context.Background(), sluice.Request{Policy: "demo", Subject: "a b"}, sluice.Incompatible, 0, sluice.ErrInvalidRequest},
		{"subject too long", context.Background(), sluice.Request{Policy: "demo", Subject: string(make([]byte, 201))}, sluice.Incompatible, 0, sluice.ErrInvalidRequest},
	}
	for _, c := range cases {
		o := l.Check(c.ctx, c.req)
		if o.Kind != c.kind || o.Cause != c.cause || !errors.Is(o.Err, c.err) {
			t.Errorf("%s: Check(%+v) = kind %v cause %v err %v, want %v %v %v", c.name, c.req, o.Kind, o.Cause, o.Err, c.kind, c.cause, c.err)
		}
	}
	if n := store.calls.Load(); n != 0 {
		t.Fatalf("the store was called %d times for requests Limiter must reject itself", n)
	}
}

// TestCheckBreaksAnOperationsRule: the rules of each operation, checked by
// the store through the engine, come back as Incompatible with the
// engine's sentinel, and nothing is spent.
func TestCheckBreaksAnOperationsRule(t *testing.T) {
	l, _, _ := newLimiter(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		req  sluice.Request
		err  error
	}{
		{"negative cost", sluice.Request{Policy: "demo", Subject: "s", Cost: -1}, sluice.ErrInvalidRequest},
		{"cost above max", sluice.Request{Policy: "demo", Subject: "s", Cost: 4}, algorithm.ErrCostTooHigh},
		{"cost above one policy's max", sluice.Request{Policies: []string{"demo", "day"}, Subject: "s", Cost: 51}, algorithm.ErrCostTooHigh},
		{"peek with a cost", sluice.Request{Op: sluice.Peek, Policy: "demo", Subject: "s", Cost: 1}, sluice.ErrInvalidRequest},
		{"reset with a cost", sluice.Request{Op: sluice.Reset, Policy: "demo", Subject: "s", Cost: 1}, sluice.ErrInvalidRequest},
		{"reset with an evaluation id", sluice.Request{Op: sluice.Reset, Policy: "demo", Subject: "s", EvaluationID: "e"}, sluice.ErrInvalidRequest},
		{"release of a rate policy", sluice.Request{Op: sluice.Release, Policy: "demo", Subject: "s", LeaseID: "l"}, sluice.ErrInvalidRequest},
		{"acquire without a concurrency policy", sluice.Request{Op: sluice.Acquire, Policy: "demo", Subject: "s"}, sluice.ErrInvalidRequest},
		{"unknown operation", sluice.Request{Op: sluice.Op(42), Policy: "demo", Subject: "s"}, sluice.ErrInvalidRequest},
	} {
		if o := l.Check(ctx, c.req); o.Kind != sluice.Incompatible || !errors.Is(o.Err, c.err) {
			t.Errorf("%s: Check(%+v) = kind %v err %v, want incompatible %v", c.name, c.req, o.Kind, o.Err, c.err)
		}
	}
	if o := l.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: "demo", Subject: "s"}); o.Remaining != 3 {
		t.Fatalf("peek after the refused requests = %+v, want 3 remaining: nothing spent", o)
	}
}

func TestCheckCostDefaultsToOne(t *testing.T) {
	l, _, _ := newLimiter(t)
	o := l.Check(context.Background(), sluice.Request{Policy: "demo", Subject: "s"})
	if o.Kind != sluice.Allowed || o.Remaining != 2 || o.Policy != "demo" || o.Statuses != nil {
		t.Fatalf("Check with zero Cost = %+v, want allowed, remaining 2 (cost 1), no Statuses for one policy", o)
	}
	o = l.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "demo", Subject: "s"})
	if o.Kind != sluice.Allowed || o.Remaining != 2 {
		t.Fatalf("peek = %+v, want allowed with remaining still 2", o)
	}
}

// failingStore fails every call with a fixed error, to check how Limiter
// types store failures.
type failingStore struct{ err error }

func (s failingStore) Evaluate(context.Context, *sluice.Evaluation) error { return s.err }

func TestStoreErrorsAreTyped(t *testing.T) {
	cases := []struct {
		err   error
		kind  sluice.Kind
		cause sluice.Cause
	}{
		{sluice.FailedBeforeSend, sluice.Unavailable, sluice.FailedBeforeSend},
		{sluice.ClockUnsafe, sluice.Unavailable, sluice.ClockUnsafe},
		{sluice.CircuitOpen, sluice.Unavailable, sluice.CircuitOpen},
		{sluice.ErrIndeterminate, sluice.Indeterminate, 0},
		{fmt.Errorf("%w: %w", sluice.ErrIndeterminate, context.DeadlineExceeded), sluice.Indeterminate, 0},
		{sluice.CorruptState, sluice.Unavailable, sluice.CorruptState},
		{context.DeadlineExceeded, sluice.Unavailable, sluice.DeadlinePassed},
		{errors.New("something the store did not classify"), sluice.Indeterminate, 0},
	}
	for _, c := range cases {
		l, err := sluice.New(failingStore{c.err}, []sluice.Policy{{ID: "p", Algorithm: sluice.GCRA, Limit: 1, Window: time.Second}}, sluice.Options{})
		if err != nil {
			t.Fatal(err)
		}
		o := l.Check(context.Background(), sluice.Request{Policy: "p", Subject: "s"})
		if o.Kind != c.kind || o.Cause != c.cause || !errors.Is(o.Err, c.err) || o.Err == nil {
			t.Errorf("store error %v: outcome %v/%v (%v), want %v/%v wrapping it", c.err, o.Kind, o.Cause, o.Err, c.kind, c.cause)
		}
	}
}

func TestNewRejectsBadPolicies(t *testing.T) {
	ms, _ := memstore.New(memstore.Options{})
	defer ms.Close()
	good := sluice.Policy{ID: "a", Algorithm: sluice.GCRA, Limit: 1, Window: time.Second}
	if _, err := sluice.New(nil, []sluice.Policy{good}, sluice.Options{}); err == nil {
		t.Error("New(nil store) = nil error")
	}
	if _, err := sluice.New(ms, []sluice.Policy{good, good}, sluice.Options{}); err == nil || !contains(err.Error(), `"a" is used twice`) {
		t.Errorf("New with a duplicate id = %v, want an error naming it", err)
	}
	bad := good
	bad.Limit = 0
	var pe *policyerr.Error
	_, err := sluice.New(ms, []sluice.Policy{good, bad}, sluice.Options{})
	if want := `sluice: New: policies[1]: policy "a": limit = 0: must be between 1 and 1000000000`; !errors.As(err, &pe) || err.Error() != want {
		t.Errorf("New with an invalid policy = %v, want a *policyerr.Error reading %q", err, want)
	}
	if _, err := sluice.New(ms, nil, sluice.Options{}); err == nil || err.Error() != "sluice: New: no policies: at least one is required" {
		t.Errorf("New without policies = %v, want an error", err)
	}
}

func TestMostRestrictiveStatus(t *testing.T) {
	l, _, _ := newLimiter(t)
	req := sluice.Request{Policies: []string{"day", "demo"}, Subject: "multi"}
	o := l.Check(context.Background(), req)
	if o.Kind != sluice.Allowed || o.Policy != "demo" || len(o.Statuses) != 2 || o.Statuses[0].Policy != "day" {
		t.Fatalf("Check(%+v) = %+v, want allowed, top-level \"demo\" (2 left beats 999), statuses in request order", req, o)
	}
}

// checkSubjects is how many subjects the Check benchmarks spread their
// decisions over, all of them holding state before the clock starts:
// issue #9's in-process target is stated on 1 024 existing keys.
const checkSubjects = 1024

// newCheckBench returns a Limiter over a default memstore (the real clock)
// with one GCRA policy no benchmark reaches, and checkSubjects
// pseudonym-like subjects of 43 bytes that each took one decision, with
// opts.
func newCheckBench(b *testing.B, opts sluice.Options) (*sluice.Limiter, []string) {
	b.Helper()
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ms.Close() })
	l, err := sluice.New(ms, []sluice.Policy{{ID: "p", Algorithm: sluice.GCRA, Limit: 1e9, Window: time.Second}}, opts)
	if err != nil {
		b.Fatal(err)
	}
	subjects := make([]string, checkSubjects)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("k1.%040x", uint64(i)*0x9E3779B97F4A7C15)
		if o := l.Check(context.Background(), sluice.Request{Policy: "p", Subject: subjects[i]}); o.Kind != sluice.Allowed {
			b.Fatalf("Check(%q) = %+v, want allowed", subjects[i], o)
		}
	}
	return l, subjects
}

// TestCheckAllocatesNothing: an allowed decision of one policy on an
// existing subject, on memstore with its default (real) clock, allocates
// nothing, for every rate algorithm: issue #9's in-process target.
func TestCheckAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("-race: sync.Pool drops items on purpose, allocation counts are not the real ones")
	}
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA} {
		ms, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer ms.Close()
		l, err := sluice.New(ms, []sluice.Policy{{ID: "p", Algorithm: a, Limit: 1e6, Window: time.Hour}}, sluice.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		req := sluice.Request{Policy: "p", Subject: "k1.0123456789abcdef0123456789abcdef01234567"}
		l.Check(ctx, req)
		var o sluice.Outcome
		if n := testing.AllocsPerRun(1000, func() { o = l.Check(ctx, req) }); n != 0 || o.Kind != sluice.Allowed {
			t.Errorf("%v: Check(%q) = %v, %v allocations per call; want allowed, 0 allocations", a, req.Subject, o.Kind, n)
		}
	}
}

// nextSubject advances the xorshift rng and picks a subject index with it.
func nextSubject(rng *uint64) int {
	*rng ^= *rng << 13
	*rng ^= *rng >> 7
	*rng ^= *rng << 17
	return int(*rng % checkSubjects)
}

// BenchmarkCheck measures one allowed decision on one of 1 024 existing
// subjects, on memstore with the real clock, from one goroutine.
func BenchmarkCheck(b *testing.B) {
	l, subjects := newCheckBench(b, sluice.Options{})
	ctx := context.Background()
	rng := uint64(0x9E3779B97F4A7C15)
	b.ReportAllocs()
	for b.Loop() {
		if o := l.Check(ctx, sluice.Request{Policy: "p", Subject: subjects[nextSubject(&rng)]}); o.Kind != sluice.Allowed {
			b.Fatalf("Check = %+v, want allowed", o)
		}
	}
}

// BenchmarkCheckParallel is BenchmarkCheck from b.RunParallel's goroutines,
// each on its own random sequence of the same subjects.
func BenchmarkCheckParallel(b *testing.B) {
	l, subjects := newCheckBench(b, sluice.Options{})
	ctx := context.Background()
	var seed atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		rng := seed.Add(0x9E3779B97F4A7C15)
		for pb.Next() {
			if o := l.Check(ctx, sluice.Request{Policy: "p", Subject: subjects[nextSubject(&rng)]}); o.Kind != sluice.Allowed {
				b.Errorf("Check = %+v, want allowed", o)
				return
			}
		}
	})
}

// TestNearCacheSparesTheStore: a flood of 100 × the limit from one subject
// on a NearCache policy reaches the store once per admission plus once for
// the first denial; the rest are denied locally, marked FromCache, with a
// RetryAfter never longer than the store's. Without NearCache every
// request reaches the store. Other subjects and a reset are unaffected.
func TestNearCacheSparesTheStore(t *testing.T) {
	for _, nearCache := range []bool{true, false} {
		clock := sluicetest.NewClock()
		ms, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		defer ms.Close()
		store := &countingStore{Store: ms}
		l, err := sluice.New(store, []sluice.Policy{{ID: "login", Algorithm: sluice.SlidingLog, Limit: 10, Window: time.Hour, NearCache: nearCache}}, sluice.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var allowed, cached int
		var storeRetry time.Duration
		for range 1000 {
			o := l.Check(ctx, sluice.Request{Policy: "login", Subject: "mallory"})
			switch {
			case o.Kind == sluice.Allowed:
				allowed++
			case o.FromCache:
				cached++
				if o.RetryAfter <= 0 || o.RetryAfter > storeRetry {
					t.Fatalf("cached denial %+v: RetryAfter must be positive and at most the store's %v", o, storeRetry)
				}
			case o.Kind == sluice.Denied:
				storeRetry = o.RetryAfter
			default:
				t.Fatalf("Check = %+v", o)
			}
		}
		calls := store.calls.Load()
		if allowed != 10 {
			t.Fatalf("near_cache %v: %d admitted, want exactly the limit, 10", nearCache, allowed)
		}
		if nearCache && (calls != 11 || cached != 989) {
			t.Fatalf("near_cache: %d store calls and %d cached denials for 1000 requests, want 11 and 989", calls, cached)
		}
		if !nearCache && (calls != 1000 || cached != 0) {
			t.Fatalf("no near_cache: %d store calls and %d cached denials, want 1000 and 0", calls, cached)
		}
		if o := l.Check(ctx, sluice.Request{Policy: "login", Subject: "alice"}); o.Kind != sluice.Allowed {
			t.Fatalf("another subject = %+v, want allowed", o)
		}
		if o := l.Check(ctx, sluice.Request{Op: sluice.Reset, Policies: l.Policies(), Subject: "mallory"}); o.Kind != sluice.Allowed {
			t.Fatalf("Reset = %+v", o)
		}
		if o := l.Check(ctx, sluice.Request{Policy: "login", Subject: "mallory"}); o.Kind != sluice.Allowed || o.FromCache {
			t.Fatalf("after a reset = %+v, want allowed by the store", o)
		}
	}
}
