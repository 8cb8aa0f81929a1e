package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/localquota"
	"github.com/sluicehq/sluice/internal/simulate"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// localCase is a policy local quota is tried on, and the bound its
// admissions must keep, checked from their times alone.
type localCase struct {
	name   string
	policy sluice.Policy
}

func localCases() []localCase {
	on := sluice.LocalQuota{Enabled: true}
	return []localCase{
		{"gcra", sluice.Policy{ID: "hot", Algorithm: sluice.GCRA, Limit: 1000, Window: time.Second, LocalQuota: on}},
		{"token_bucket", sluice.Policy{ID: "hot", Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Second, Burst: 200, LocalQuota: on}},
		{"fixed_window/aligned", sluice.Policy{ID: "hot", Algorithm: sluice.FixedWindow, Limit: 1000, Window: time.Second, ClockAligned: true, LocalQuota: on}},
		{"fixed_window", sluice.Policy{ID: "hot", Algorithm: sluice.FixedWindow, Limit: 1000, Window: time.Second, LocalQuota: on}},
	}
}

// fleet is n Limiters, as n processes would have, on one store and one
// fake clock.
type fleet struct {
	clock    *sluicetest.Clock
	store    *countingStore
	limiters []*sluice.Limiter
	tally    *localquota.Tally // what local quota did, summed over the limiters
}

func newFleet(t *testing.T, n int, p sluice.Policy) *fleet {
	t.Helper()
	f := &fleet{clock: sluicetest.NewClock(), tally: new(localquota.Tally)}
	f.store = &countingStore{Store: newMemstore(t, f.clock)}
	for range n {
		l, err := sluice.New(f.store, []sluice.Policy{p}, sluice.Options{Clock: f.clock, OnLocalQuota: f.tally.Add})
		if err != nil {
			t.Fatal(err)
		}
		f.limiters = append(f.limiters, l)
	}
	return f
}

// phase is traffic at a rate, a multiple of the policy's Limit per
// Window, for a while.
type phase struct {
	rate float64
	span time.Duration
}

// admission is one admitted request (of cost 1), at the fake clock's time.
type admission struct {
	at time.Time
}

// run offers the phases' traffic to f's Limiters in turn at random (one
// request at a time, so a seed gives one sequence), and returns the
// admissions, and the decisions and store calls of the phases whose rate
// is below 1.
func (f *fleet) run(t *testing.T, p sluice.Policy, seed uint64, phases []phase) (admitted []admission, decisions, calls int64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx := context.Background()
	for _, ph := range phases {
		end := f.clock.Now().Add(ph.span)
		mean := float64(p.Window) / (ph.rate * float64(p.Limit))
		before := f.store.calls.Load()
		for n := int64(0); f.clock.Now().Before(end); n++ {
			l := f.limiters[rng.IntN(len(f.limiters))]
			o := l.Check(ctx, sluice.Request{Policy: p.ID, Subject: "tenant-1"})
			switch o.Kind {
			case sluice.Allowed:
				admitted = append(admitted, admission{f.clock.Now()})
			case sluice.Denied:
			default:
				t.Fatalf("Check = %+v, want a decision", o)
			}
			if ph.rate < 1 {
				decisions++
			}
			f.clock.Advance(time.Duration(rng.ExpFloat64()*mean) + time.Microsecond)
		}
		if ph.rate < 1 {
			calls += f.store.calls.Load() - before
		}
	}
	return admitted, decisions, calls
}

// overBound reports, from the admission times alone, the interval in
// which adm holds most over what p's algorithm can ever admit, or "" (see
// simulate.OverBound, whose cases TestSimulateOverBound holds to it).
func overBound(p sluice.Policy, adm []admission) string {
	p = evaluation.Defaults(p)
	times := make([]int64, len(adm))
	for i, a := range adm {
		times[i] = a.at.UnixMicro()
	}
	origin := sluicetest.NewClock().Now().UnixMicro() // the fake clock's start: times read from it
	return simulate.OverBound(algorithm.Kind(p.Algorithm), algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst, Aligned: p.ClockAligned}, times, origin)
}

// traffic is what the exactness test offers: below the limit (blocks are
// taken), far above it (the limit is reached), idle, a burst, above again.
var traffic = []phase{{0.5, 3 * time.Second}, {4, 3 * time.Second}, {0.01, 2 * time.Second}, {0.8, time.Second}, {4, 2 * time.Second}}

// TestLocalQuotaExact offers four Limiters, as four processes would be,
// one hot subject's traffic below and then at four times its limit, and
// checks from the admission times alone that no interval holds more than
// the algorithm's bound, that at least 90% of what one exact Limiter
// admits on the same traffic is admitted, and that blocks were taken.
func TestLocalQuotaExact(t *testing.T) {
	for _, c := range localCases() {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 3; seed++ {
				f := newFleet(t, 4, c.policy)
				adm, _, _ := f.run(t, c.policy, seed, traffic)
				if msg := overBound(c.policy, adm); msg != "" {
					t.Fatalf("seed %d: %s", seed, msg)
				}
				exact := c.policy
				exact.LocalQuota = sluice.LocalQuota{}
				want, _, _ := newFleet(t, 4, exact).run(t, exact, seed, traffic)
				if msg := overBound(exact, want); msg != "" {
					t.Fatalf("seed %d, without local quota: %s (the check itself is wrong)", seed, msg)
				}
				stats := f.tally.Stats("hot")
				share := float64(len(adm)) / float64(len(want))
				t.Logf("seed %d: admitted %d, exact %d (%.3f), %d from %d blocks, %d units unused", seed, len(adm), len(want), share, stats.Local, stats.Blocks, stats.Unused)
				if share < 0.9 {
					t.Errorf("seed %d: admitted %d, %.3f of the %d one exact Limiter admits: want at least 0.9", seed, len(adm), share, len(want))
				}
				if stats.Blocks == 0 || stats.Local == 0 {
					t.Errorf("seed %d: local quota did %+v: no block was taken", seed, stats)
				}
			}
		})
	}
}

// TestLocalQuotaCutsStoreCalls offers one hot subject 200 000 requests a
// second through four Limiters, far below its limit: at most one in 50
// reaches the store.
func TestLocalQuotaCutsStoreCalls(t *testing.T) {
	for _, c := range localCases() {
		t.Run(c.name, func(t *testing.T) {
			p := c.policy
			p.Limit, p.Burst = 1_000_000, 0
			f := newFleet(t, 4, p)
			f.run(t, p, 6, []phase{{0.2, 500 * time.Millisecond}}) // the arrival rate is learnt over three block times
			_, decisions, calls := f.run(t, p, 7, []phase{{0.2, time.Second}})
			perDecision := float64(calls) / float64(decisions)
			t.Logf("%d decisions, %d store calls: %.4f per decision", decisions, calls, perDecision)
			if perDecision > 0.02 {
				t.Errorf("%d store calls for %d decisions (%.4f each): want at most 0.02", calls, decisions, perDecision)
			}
		})
	}
}

// TestLocalQuotaRareSubjects: subjects seen a few times a second never
// take a block, so each of their decisions is the store's.
func TestLocalQuotaRareSubjects(t *testing.T) {
	p := localCases()[0].policy
	f := newFleet(t, 1, p)
	l := f.limiters[0]
	for i := range 20_000 {
		subject := fmt.Sprintf("user-%d", i%1000)
		if o := l.Check(context.Background(), sluice.Request{Policy: "hot", Subject: subject}); o.Kind != sluice.Allowed || o.Local {
			t.Fatalf("Check(%q) = %+v, want allowed by the store", subject, o)
		}
		f.clock.Advance(100 * time.Microsecond) // 10 000 a second over 1000 subjects: 10 each
	}
	if s := f.tally.Stats("hot"); s.Blocks != 0 || s.Local != 0 {
		t.Errorf("local quota did %+v, want no block", s)
	}
	if n := f.store.calls.Load(); n != 20_000 {
		t.Errorf("store calls = %d, want 20000: one per decision", n)
	}
}

// switchStore is a real memstore that can be made to fail every call, as
// an unreachable Redis does.
type switchStore struct {
	*memstore.Store
	mu   sync.Mutex
	down bool
}

func (s *switchStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return errors.Join(sluice.FailedBeforeSend, errors.New("dial tcp 127.0.0.1:6379: connection refused"))
	}
	return s.Store.Evaluate(ctx, ev)
}

// TestLocalQuotaStoreDown: a block in hand keeps admitting while the store
// is unreachable, each admission marked Local, until its time is up; then
// the store's failure is the answer again.
func TestLocalQuotaStoreDown(t *testing.T) {
	clock := sluicetest.NewClock()
	store := &switchStore{Store: newMemstore(t, clock)}
	p := localCases()[0].policy
	l, err := sluice.New(store, []sluice.Policy{p}, sluice.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, req := context.Background(), sluice.Request{Policy: "hot", Subject: "tenant-1"}
	var local int
	for local == 0 { // hot enough for a block
		o := l.Check(ctx, req)
		if o.Kind != sluice.Allowed {
			t.Fatalf("Check = %+v, want allowed", o)
		}
		if o.Local {
			local++
		}
		clock.Advance(time.Millisecond)
	}
	store.mu.Lock()
	store.down = true
	store.mu.Unlock()
	served := 0
	for range 200 {
		o := l.Check(ctx, req)
		if o.Kind != sluice.Allowed {
			if o.Kind != sluice.Unavailable || o.Cause != sluice.FailedBeforeSend {
				t.Fatalf("Check with the store down = %+v, want allowed from the block or unavailable", o)
			}
			break
		}
		if !o.Local {
			t.Fatalf("Check with the store down = %+v: allowed, but not from a block", o)
		}
		served++
		clock.Advance(100 * time.Microsecond)
	}
	if served == 0 {
		t.Fatal("no request was admitted from the block in hand")
	}
	clock.Advance(evaluation.Defaults(p).LocalQuota.BlockTime)
	if o := l.Check(ctx, req); o.Kind != sluice.Unavailable {
		t.Errorf("Check after the block's time = %+v, want unavailable", o)
	}
	t.Logf("%d admitted from the block with the store down", served)
}

// TestLocalQuotaConcurrent: callers at once on several Limiters of one
// store never admit more than the limit, blocks or not (and -race sees
// the block's hand-over).
func TestLocalQuotaConcurrent(t *testing.T) {
	p := sluice.Policy{ID: "hot", Algorithm: sluice.FixedWindow, Limit: 5000, Window: time.Hour, LocalQuota: sluice.LocalQuota{Enabled: true, BlockTime: time.Second, MaxBlock: 500}}
	f := newFleet(t, 4, p)
	// The arrival rate is learnt over three block times; from then on the
	// fake clock stands still: every block lives its whole time, and only
	// the limit stops them.
	for range 4 {
		for _, l := range f.limiters {
			for range 100 {
				l.Check(context.Background(), sluice.Request{Policy: "hot", Subject: "tenant-1"})
			}
		}
		f.clock.Advance(time.Second)
	}
	var admitted, local sync.Map
	var wg sync.WaitGroup
	for i, l := range f.limiters {
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var n, m int
				for range 1000 {
					o := l.Check(context.Background(), sluice.Request{Policy: "hot", Subject: "tenant-1"})
					if o.Kind == sluice.Allowed {
						n++
						if o.Local {
							m++
						}
					}
				}
				admitted.Store(i*8+g, n)
				local.Store(i*8+g, m)
			}()
		}
	}
	wg.Wait()
	total, fromBlocks := 4*4*100, 0
	admitted.Range(func(_, v any) bool { total += v.(int); return true })
	local.Range(func(_, v any) bool { fromBlocks += v.(int); return true })
	if total > 5000 || total < 5000-4*500 {
		t.Errorf("admitted %d of a limit of 5000 over 32 000 requests, want 5000 less at most the four blocks in hand", total)
	}
	if fromBlocks == 0 {
		t.Error("no request was admitted from a block")
	}
	t.Logf("admitted %d, %d from blocks, %d store calls", total, fromBlocks, f.store.calls.Load())
}

// TestLocalQuotaOverride: an override takes local quota's defaults of its
// own numbers, and numbers too small for blocks leave the subject to the
// store, one request at a time.
func TestLocalQuotaOverride(t *testing.T) {
	p := localCases()[0].policy
	f := newFleet(t, 1, p)
	l := f.limiters[0]
	ctx := context.Background()
	for _, o := range []sluice.Override{{Policy: "hot", Subject: "big", Limit: 100_000}, {Policy: "hot", Subject: "small", Limit: 5}} {
		if err := l.SetOverride(ctx, o); err != nil {
			t.Fatalf("SetOverride(%+v) = %v", o, err)
		}
	}
	for _, c := range []struct {
		subject   string
		wantLocal bool
	}{{"big", true}, {"small", false}} {
		local, allowed := 0, 0
		for range 4000 { // 400ms: the arrival rate is learnt over three block times
			o := l.Check(ctx, sluice.Request{Policy: "hot", Subject: c.subject})
			if o.Kind == sluice.Allowed {
				allowed++
			}
			if o.Local {
				local++
			}
			f.clock.Advance(100 * time.Microsecond)
		}
		if (local > 0) != c.wantLocal {
			t.Errorf("subject %q: %d of 4000 admitted from blocks, want some: %v", c.subject, local, c.wantLocal)
		}
		if c.subject == "big" {
			// Another subject's plan rebuilds the snapshot, "big" included
			// with the same numbers: its block stays.
			if err := l.SetOverride(ctx, sluice.Override{Policy: "hot", Subject: "other", Limit: 2000}); err != nil {
				t.Fatal(err)
			}
			local := 0
			for range 10 {
				if l.Check(ctx, sluice.Request{Policy: "hot", Subject: "big"}).Local {
					local++
				}
				f.clock.Advance(100 * time.Microsecond)
			}
			if local < 8 { // a block may run out, and the next be asked
				t.Errorf("after another subject's override, %d of 10 checks of big admitted from blocks, want at least 8: it kept what it asked lately", local)
			}
		}
		if c.subject == "small" && (allowed < 5 || allowed > 7) {
			t.Errorf("subject %q, limited to 5 per second: %d of 4000 admitted over 400ms, want 5 to 7 (a burst of 5, and 2 refilled)", c.subject, allowed)
		}
	}
}

// TestLocalQuotaOverrideSameNumbers: a subject's block is kept under the
// numbers it was taken under. Its override set again with the same
// numbers (a new note) keeps it; one with other numbers drops it, its
// units counted unused, and the subject is decided by the store until
// its arrivals under the new numbers are learnt.
func TestLocalQuotaOverrideSameNumbers(t *testing.T) {
	f := newFleet(t, 1, localCases()[0].policy)
	l, ctx := f.limiters[0], context.Background()
	set := func(o sluice.Override) {
		t.Helper()
		if err := l.SetOverride(ctx, o); err != nil {
			t.Fatalf("SetOverride(%+v) = %v", o, err)
		}
	}
	local := func(n int) (local int) {
		for range n {
			if l.Check(ctx, sluice.Request{Policy: "hot", Subject: "big"}).Local {
				local++
			}
			f.clock.Advance(100 * time.Microsecond)
		}
		return local
	}
	o := sluice.Override{Policy: "hot", Subject: "big", Limit: 100_000, Note: "plan a"}
	set(o)
	if n := local(4000); n == 0 { // 400ms: the arrival rate is learnt over three block times
		t.Fatal("no check of 4000 admitted from a block")
	}
	o.Note = "plan a, renamed"
	set(o)
	if n := local(10); n < 8 { // a block may run out, and the next be asked
		t.Errorf("after the override was set again with the same numbers, %d of 10 checks admitted from blocks, want at least 8: its block stays", n)
	}
	unused := f.tally.Stats("hot").Unused
	o.Limit = 200_000
	set(o)
	if n := local(10); n != 0 {
		t.Errorf("after the override was given other numbers, %d of 10 checks admitted from blocks, want 0: a block is kept only under the numbers it was taken under", n)
	}
	if got := f.tally.Stats("hot").Unused; got <= unused {
		t.Errorf("unused units %d after the block was dropped, want more than %d", got, unused)
	}
}

// hotLimiter returns a Limiter on a memstore with a local-quota policy
// "hot" whose subject "tenant-1" has been asked for 400ms: past the three
// block times after which it is admitted from blocks.
func hotLimiter(b *testing.B) (*sluice.Limiter, sluice.Request) {
	l, err := sluice.New(newMemstore(b, nil), []sluice.Policy{{ID: "hot", Algorithm: sluice.GCRA, Limit: 1_000_000_000, Window: time.Second, LocalQuota: sluice.LocalQuota{Enabled: true}}}, sluice.Options{})
	if err != nil {
		b.Fatal(err)
	}
	req := sluice.Request{Policy: "hot", Subject: "tenant-1"}
	for end := time.Now().Add(400 * time.Millisecond); time.Now().Before(end); {
		l.Check(context.Background(), req)
	}
	return l, req
}

// BenchmarkCheckLocal is a hot subject's Check answered from its block:
// what a decision costs the caller's process with local quota, against
// BenchmarkCheck's store decision on memstore.
func BenchmarkCheckLocal(b *testing.B) {
	l, req := hotLimiter(b)
	ctx, local := context.Background(), 0
	b.ReportAllocs()
	for b.Loop() {
		o := l.Check(ctx, req)
		if o.Kind != sluice.Allowed {
			b.Fatal(o.Err)
		}
		if o.Local {
			local++
		}
	}
	b.ReportMetric(float64(local)/float64(b.N), "local/op")
}

func BenchmarkCheckLocalParallel(b *testing.B) {
	l, req := hotLimiter(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if o := l.Check(context.Background(), req); o.Kind != sluice.Allowed {
				b.Error(o.Err)
				return
			}
		}
	})
}
