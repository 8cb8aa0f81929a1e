package memstore

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/form"
	"github.com/sluicehq/sluice/sluicetest"
)

func mustNew(t testing.TB, opts Options) *Store {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func evaluationOf(subject string, p *sluice.Policy, cost int64) *sluice.Evaluation {
	ev := &sluice.Evaluation{Subject: subject, Policies: []*sluice.Policy{p}, Cost: cost}
	if cost == 0 {
		ev.Op = sluice.Peek
	}
	return ev
}

func validPolicy(t testing.TB, p sluice.Policy) *sluice.Policy {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	p = evaluation.Defaults(p)
	return &p
}

func TestNewRejectsNegativeOptions(t *testing.T) {
	for _, o := range []Options{{Shards: -1}, {MaxKeys: -5}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) = nil error, want one naming the field", o)
		}
	}
}

// TestMaxKeysBound floods the store with distinct subjects and checks that
// it never holds more than the bound, that expired states make room before
// live ones are evicted, that evictions are counted, and that a decision at
// the bound looks at a bounded sample, not the whole shard.
func TestMaxKeysBound(t *testing.T) {
	clock := sluicetest.NewClock()
	// One shard, so the bound is exactly MaxKeys (it is per shard).
	s := mustNew(t, Options{Clock: clock, Shards: 1, MaxKeys: 64, SweepInterval: -1})
	short := validPolicy(t, sluice.Policy{ID: "short", Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Second})
	long := validPolicy(t, sluice.Policy{ID: "long", Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Hour})
	ctx := context.Background()
	add := func(name string, p *sluice.Policy) {
		t.Helper()
		if err := s.Evaluate(ctx, evaluationOf(name, p, 1)); err != nil {
			t.Fatal(err)
		}
		if n := s.Len(); n > 64 {
			t.Fatalf("Len = %d after adding %s, want at most MaxKeys 64", n, name)
		}
	}
	for i := 0; i < 64; i++ {
		add(fmt.Sprint("short-", i), short)
	}
	clock.Advance(2 * time.Second) // every "short" state has expired
	add("long-0", long)
	if e, n := s.evictions.Load(), s.Len(); e != 0 || n != 64-roomSample+1 {
		t.Fatalf("first state at the bound, all others expired: %d evictions, Len %d; want 0 and %d (the expired of one sample of %d dropped)", e, n, 64-roomSample+1, roomSample)
	}
	s.sweep()
	for i := 1; i < 64; i++ {
		add(fmt.Sprint("long-", i), long)
	}
	// Now every state is live: new subjects must evict, counted, bound kept.
	for i := 0; i < 1000; i++ {
		add(fmt.Sprint("flood-", i), long)
	}
	if e := s.evictions.Load(); e != 1000 {
		t.Fatalf("Evictions = %d after 1000 new subjects into a full store of live states, want 1000", e)
	}
}

// TestMultiPolicyAtBoundKeepsItsSpend: making room for a new policy's state
// never drops the other states the same decision is writing.
func TestMultiPolicyAtBoundKeepsItsSpend(t *testing.T) {
	clock := sluicetest.NewClock()
	s := mustNew(t, Options{Clock: clock, Shards: 1, MaxKeys: 2, SweepInterval: -1})
	a := validPolicy(t, sluice.Policy{ID: "a", Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Second})
	b := validPolicy(t, sluice.Policy{ID: "b", Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Hour})
	ctx := context.Background()
	if err := s.Evaluate(ctx, evaluationOf("alice", b, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Evaluate(ctx, evaluationOf("bob", a, 1)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour) // both expired, still held
	ev := &sluice.Evaluation{Subject: "alice", Policies: []*sluice.Policy{a, b}, Cost: 3}
	if err := s.Evaluate(ctx, ev); err != nil || !ev.Statuses[1].Allowed || ev.Statuses[1].Remaining != 2 {
		t.Fatalf("multi-policy spend of 3 = %+v, %v; want b allowed with 2 left", ev.Statuses, err)
	}
	peek := &sluice.Evaluation{Op: sluice.Peek, Subject: "alice", Policies: []*sluice.Policy{b}}
	if err := s.Evaluate(ctx, peek); err != nil || peek.Statuses[0].Remaining != 2 {
		t.Fatalf("peek at b after the spend = %+v, %v; want 2 left: the spend must not be lost while making room", peek.Statuses, err)
	}
}

// TestMaxKeysBoundsEvaluationIDs floods one shard with remembered ids of
// many subjects: their total never exceeds MaxKeys, and the subject being
// served keeps its newest id.
func TestMaxKeysBoundsEvaluationIDs(t *testing.T) {
	clock := sluicetest.NewClock()
	s := mustNew(t, Options{Clock: clock, Shards: 1, MaxKeys: 64, SweepInterval: -1})
	p := validPolicy(t, sluice.Policy{ID: "p", Algorithm: sluice.GCRA, Limit: 1e6, Window: time.Second, DedupeMax: 100})
	ctx := context.Background()
	for i := 0; i < 2000; i++ {
		ev := evaluationOf(fmt.Sprint("subject-", i%50), p, 1)
		ev.EvaluationID = fmt.Sprint("id-", i)
		if err := s.Evaluate(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if n := s.shards[0].ids; n > 64 {
			t.Fatalf("after %d ids: %d remembered, want at most MaxKeys 64", i+1, n)
		}
		ev.Statuses = nil
		if err := s.Evaluate(ctx, ev); err != nil || !ev.Replayed {
			t.Fatalf("repeat of the id just decided: replayed=%v err=%v, want replayed", ev.Replayed, err)
		}
	}
	if s.idsLost.Load() == 0 || s.evictions.Load() != 0 {
		t.Fatalf("2000 ids of 50 subjects through a bound of 64: EvictedIDs %d, Evictions %d; want some ids and no state (50 states fit)", s.idsLost.Load(), s.evictions.Load())
	}
	// Expired ids make room without evicting anything live.
	clock.Advance(time.Hour)
	before := s.idsLost.Load()
	for i := 0; i < 64; i++ {
		ev := evaluationOf("late", p, 1)
		ev.EvaluationID = fmt.Sprint("late-", i)
		s.Evaluate(ctx, ev)
	}
	if s.idsLost.Load() != before || s.shards[0].ids != 64 {
		t.Fatalf("after expiry: EvictedIDs %d → %d, %d ids; want no eviction and 64 ids", before, s.idsLost.Load(), s.shards[0].ids)
	}
}

func TestExpiredStateIsReclaimed(t *testing.T) {
	clock := sluicetest.NewClock()
	s := mustNew(t, Options{Clock: clock, SweepInterval: -1})
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA} {
		p := validPolicy(t, sluice.Policy{ID: a.String(), Algorithm: a, Limit: 5, Window: time.Second})
		if err := s.Evaluate(ctx, evaluationOf("alice", p, 2)); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n != 5 {
		t.Fatalf("Len = %d, want 5 states", n)
	}
	clock.Advance(2*time.Second - time.Microsecond)
	// Every state but the sliding window's (it weighs the previous window
	// for one more) has expired.
	if n := s.sweep(); n != 4 || s.Len() != 1 {
		t.Fatalf("Sweep 1µs before the sliding window expires dropped %d, Len %d; want 4 and 1", n, s.Len())
	}
	clock.Advance(time.Microsecond)
	if n := s.sweep(); n != 1 || s.Len() != 0 {
		t.Fatalf("Sweep after every expiry dropped %d, Len %d; want 1 and 0", n, s.Len())
	}
}

// TestSweeperStopsOnClose: Close returns only once the sweeper goroutine
// has returned (it closes done as it does), and a second Close too.
func TestSweeperStopsOnClose(t *testing.T) {
	for i := 0; i < 20; i++ {
		s, err := New(Options{SweepInterval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		select {
		case <-s.done:
		default:
			t.Fatalf("store %d: Close returned while the sweeper was still running", i)
		}
		s.Close() // idempotent
	}
}

func TestEvaluateExistingKeyAllocatesNothing(t *testing.T) {
	clock := sluicetest.NewClock()
	s := mustNew(t, Options{Clock: clock, SweepInterval: -1})
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA} {
		p := validPolicy(t, sluice.Policy{ID: "p", Algorithm: a, Limit: 1_000_000_000, Window: time.Second})
		ev := evaluationOf("alice", p, 1)
		if err := s.Evaluate(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(200, func() { s.Evaluate(ctx, ev) }); n != 0 {
			t.Errorf("%v: %v allocations per decision on an existing key, want 0", a, n)
		}
	}
}

// benchmarkPolicies are realistic policies that rarely deny, so the
// benchmarks measure the admitting path.
func benchmarkPolicy(b *testing.B, a sluice.Algorithm) *sluice.Policy {
	limit := int64(1_000_000_000)
	if a == sluice.SlidingLog {
		limit = 100_000
	}
	return validPolicy(b, sluice.Policy{ID: "bench", Algorithm: a, Limit: limit, Window: time.Second})
}

// BenchmarkEvaluate measures one decision on an existing key with the real
// clock, per algorithm, from one goroutine and from many; /general is the
// same decision in the general form, the short course's reference in the
// same run.
func BenchmarkEvaluate(b *testing.B) {
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA} {
		for _, general := range []bool{false, true} {
			name := a.String()
			if general {
				name += "/general"
			}
			b.Run(name, func(b *testing.B) {
				s := mustNew(b, Options{})
				p := benchmarkPolicy(b, a)
				ev := evaluationOf("alice", p, 1)
				if !general {
					form.Record(ev) // the short form, as the Limiter gives it
				}
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					if err := s.Evaluate(ctx, ev); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(a.String()+"/parallel", func(b *testing.B) {
			s := mustNew(b, Options{})
			p := benchmarkPolicy(b, a)
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine its own subject: the contention of a real
				// service, where subjects differ.
				ev := evaluationOf(fmt.Sprintf("subject-%p", &pb), p, 1)
				form.Record(ev)
				for pb.Next() {
					if err := s.Evaluate(ctx, ev); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkMemoryPerState reports what each state and each remembered
// evaluation id costs the process, at scale: memoryN of them in one store,
// each subject 43 bytes long (a pseudonym's length), and the heap the
// runtime holds for them (HeapInuse after a GC, before and after, over
// memoryN): what is reachable plus the empty slots of growing maps and the
// unused rest of size classes. B/state is per (subject, policy) state;
// B/id per remembered id on a subject that has many; "flood" is issue 10's
// case, every request a new subject with an id of its own, B/request its
// state and its id. Run with -benchtime 1x; a process's peak is up to
// twice the live heap under GOGC=100.
func BenchmarkMemoryPerState(b *testing.B) {
	const memoryN = 200_000
	measure := func(b *testing.B, fill func(s *Store, i int)) float64 {
		var total float64
		for range b.N {
			s := mustNew(b, Options{SweepInterval: -1, MaxKeys: 2 * memoryN})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for j := range memoryN {
				fill(s, j)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			total += float64(after.HeapInuse-before.HeapInuse) / memoryN
			runtime.KeepAlive(s)
		}
		return total / float64(b.N)
	}
	subject := func(i int) string { return fmt.Sprintf("k1:%040d", i) } // 43 bytes
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA} {
		b.Run(a.String(), func(b *testing.B) {
			p := validPolicy(b, sluice.Policy{ID: "p", Algorithm: a, Limit: 100, Window: time.Minute})
			b.ReportMetric(measure(b, func(s *Store, i int) {
				s.Evaluate(ctx, evaluationOf(subject(i), p, 1))
			}), "B/state")
		})
	}
	b.Run("ids", func(b *testing.B) {
		p := validPolicy(b, sluice.Policy{ID: "p", Algorithm: sluice.GCRA, Limit: 1e9, Window: time.Second, DedupeMax: 10_000})
		b.ReportMetric(measure(b, func(s *Store, i int) {
			// memoryN/10_000 subjects, so every id stays within DedupeMax.
			ev := evaluationOf(subject(i%(memoryN/10_000)), p, 1)
			ev.EvaluationID = fmt.Sprintf("%036d", i) // a UUID's length
			s.Evaluate(ctx, ev)
		}), "B/id")
	})
	b.Run("flood", func(b *testing.B) {
		p := validPolicy(b, sluice.Policy{ID: "p", Algorithm: sluice.GCRA, Limit: 100, Window: time.Minute})
		b.ReportMetric(measure(b, func(s *Store, i int) {
			ev := evaluationOf(subject(i), p, 1)
			ev.EvaluationID = fmt.Sprintf("%036d", i)
			s.Evaluate(ctx, ev)
		}), "B/request")
	})
}

// BenchmarkMemoryFlood is issue 10's flood at the default MaxKeys: 2 000 000
// distinct subjects (43-byte pseudonyms), one request each, then the heap
// the runtime holds after a GC (MiB-heap) and the process's peak resident
// memory so far (MiB-peak-rss, VmHWM of /proc/self/status; Linux only),
// without ids and then with an id per request. Evicting at the bound
// leaves maps larger and spans emptier than filling them once does, so
// these exceed BenchmarkMemoryPerState's figures × MaxKeys. Run it alone,
// once: -benchtime 1x, no -count.
func BenchmarkMemoryFlood(b *testing.B) {
	for _, ids := range []bool{false, true} {
		b.Run(map[bool]string{false: "states", true: "ids"}[ids], func(b *testing.B) {
			p := validPolicy(b, sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Minute})
			ctx := context.Background()
			for range b.N {
				// A clock that stands still: no id expires, the worst case.
				s := mustNew(b, Options{Clock: sluicetest.NewClock(), SweepInterval: -1})
				for i := range 2_000_000 {
					ev := evaluationOf(fmt.Sprintf("k1:%040d", i), p, 1)
					if ids {
						ev.EvaluationID = fmt.Sprintf("%036d", i)
					}
					s.Evaluate(ctx, ev)
				}
				runtime.GC()
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				b.ReportMetric(float64(m.HeapInuse)/(1<<20), "MiB-heap")
				if status, err := os.ReadFile("/proc/self/status"); err == nil {
					for _, line := range strings.Split(string(status), "\n") {
						if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
							kb, _ := strconv.ParseFloat(f[1], 64)
							b.ReportMetric(kb/1024, "MiB-peak-rss")
						}
					}
				}
				runtime.KeepAlive(s)
				s.Close()
			}
		})
	}
}

// TestAlgorithmsShareAShard: decisions of different algorithms one after
// another in one shard (the same subject) each start from their own state,
// whatever the decision before them left behind.
func TestAlgorithmsShareAShard(t *testing.T) {
	clock := sluicetest.NewClock()
	s := mustNew(t, Options{Clock: clock, Shards: 1, SweepInterval: -1})
	ctx := context.Background()
	var ps []*sluice.Policy
	for _, a := range []sluice.Algorithm{sluice.SlidingLog, sluice.FixedWindow, sluice.GCRA, sluice.SlidingLog, sluice.TokenBucket, sluice.SlidingWindow} {
		ps = append(ps, validPolicy(t, sluice.Policy{ID: fmt.Sprint("p", len(ps)), Algorithm: a, Limit: 5, Window: 24 * time.Hour}))
	}
	for round := range 5 {
		for i, p := range ps {
			clock.Advance(time.Second)
			ev := evaluationOf("alice", p, 1)
			if err := s.Evaluate(ctx, ev); err != nil {
				t.Fatal(err)
			}
			if st := ev.Statuses[0]; !st.Allowed || st.Remaining != int64(4-round) {
				t.Fatalf("round %d, %v (policy %d): %+v, want allowed with %d left", round, p.Algorithm, i, st, 4-round)
			}
		}
	}
	for _, head := range s.shards[0].states.m {
		for en := head; en != nil; en = en.next {
			if en.kind != algorithm.KindSlidingLog && len(en.st.Log) != 0 {
				t.Errorf("%s (%v) holds a log of %d entries: another decision's edit was applied to it", en.key.policy, en.kind, len(en.st.Log))
			}
			if en.kind == algorithm.KindSlidingLog && en.st.V != [5]int64{} {
				t.Errorf("%s (sliding_log) holds fields %v: another decision's fields were applied to it", en.key.policy, en.st.V)
			}
		}
	}
}

// TestFloodKeepsExhaustedSubjects: a flood of new subjects at the MaxKeys
// bound evicts states that gave away little (one unit of ten spent) before
// subjects that exhausted their budget, so spraying subjects cannot unlock
// a login limit.
func TestFloodKeepsExhaustedSubjects(t *testing.T) {
	clock := sluicetest.NewClock()
	s := mustNew(t, Options{Clock: clock, Shards: 1, MaxKeys: 200, SweepInterval: -1})
	login := validPolicy(t, sluice.Policy{ID: "login", Algorithm: sluice.SlidingLog, Limit: 10, Window: time.Hour})
	ctx := context.Background()
	for i := range 100 {
		if err := s.Evaluate(ctx, evaluationOf(fmt.Sprint("victim-", i), login, 10)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5000 {
		if err := s.Evaluate(ctx, evaluationOf(fmt.Sprint("spray-", i), login, 1)); err != nil {
			t.Fatal(err)
		}
	}
	unlocked := 0
	for i := range 100 {
		ev := evaluationOf(fmt.Sprint("victim-", i), login, 1)
		if err := s.Evaluate(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if ev.Statuses[0].Allowed {
			unlocked++
		}
	}
	if unlocked != 0 {
		t.Fatalf("%d of 100 exhausted subjects admitted again after a flood of 5000 new subjects: evicted before fresh states", unlocked)
	}
	if s.evictions.Load() == 0 {
		t.Fatal("no eviction: the flood did not reach the bound, the test proved nothing")
	}
}

// held returns the states and the remembered ids s holds of subjects
// whose name starts with prefix, expired ones not yet dropped included.
func (s *Store) held(prefix string) (states, ids int) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, head := range sh.states.m {
			for e := head; e != nil; e = e.next {
				if strings.HasPrefix(e.key.subject, prefix) {
					states++
				}
			}
		}
		for k, l := range sh.dedupe {
			if strings.HasPrefix(k.subject, prefix) {
				ids += l.Len()
			}
		}
		sh.mu.Unlock()
	}
	return states, ids
}

// TestEvictionsCountLiveStates sprays more distinct subjects than MaxKeys,
// each with an evaluation id of its own, on a clock that stands still:
// Evictions is exactly the states dropped (every subject made one, so
// subjects − Len) and EvictedIDs exactly the ids dropped (subjects − ids
// held), each counting nothing of the other. Once everything has expired,
// the expired entries dropped to make room and by the sweeper count
// nothing: only the new subjects' own live entries dropped do.
func TestEvictionsCountLiveStates(t *testing.T) {
	clock := sluicetest.NewClock()
	const maxKeys, subjects = 256, 5000
	s := mustNew(t, Options{Clock: clock, Shards: 4, MaxKeys: maxKeys, SweepInterval: -1})
	p := validPolicy(t, sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Minute, DedupeTTL: time.Hour})
	ctx := context.Background()
	spray := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			ev := evaluationOf(fmt.Sprint(prefix, i), p, 1)
			ev.EvaluationID = fmt.Sprint("id-", prefix, i)
			if err := s.Evaluate(ctx, ev); err != nil || !ev.Statuses[0].Allowed {
				t.Fatalf("Evaluate(%s%d) = %+v, %v; want allowed", prefix, i, ev.Statuses, err)
			}
		}
	}
	spray("k1:", subjects)
	held, ids := s.held("")
	if held != maxKeys || ids != maxKeys {
		t.Fatalf("after %d subjects at a bound of %d: Len %d, ids held %d; want both at the bound", subjects, maxKeys, held, ids)
	}
	if e := s.evictions.Load(); e != int64(subjects-held) {
		t.Fatalf("Evictions = %d after %d subjects, %d states held, nothing expired; want %d (subjects − held), not counting ids", e, subjects, held, subjects-held)
	}
	if e := s.idsLost.Load(); e != int64(subjects-ids) {
		t.Fatalf("EvictedIDs = %d after %d ids, %d held, nothing expired; want %d", e, subjects, ids, subjects-ids)
	}
	clock.Advance(2 * time.Hour) // every state and id has expired
	states, lost := s.evictions.Load(), s.idsLost.Load()
	spray("k2:", maxKeys)
	newStates, newIDs := s.held("k2:")
	if e, l := s.evictions.Load()-states, s.idsLost.Load()-lost; e != int64(maxKeys-newStates) || l != int64(maxKeys-newIDs) {
		t.Fatalf("%d new subjects among expired ones: %d more Evictions, %d more EvictedIDs; want %d and %d (the new ones not held)", maxKeys, e, l, maxKeys-newStates, maxKeys-newIDs)
	}
	states, lost = s.evictions.Load(), s.idsLost.Load()
	if s.sweep(); s.Len() != newStates {
		t.Fatalf("Sweep left %d states, want only the %d new ones", s.Len(), newStates)
	}
	if e, l := s.evictions.Load(), s.idsLost.Load(); e != states || l != lost {
		t.Fatalf("a sweep of expired entries: Evictions %d → %d, EvictedIDs %d → %d; want both unchanged", states, e, lost, l)
	}
}

// TestEvictedIDsOfTheSubjectBeingServed: one log holding more ids than the
// bound (DedupeMax above it) loses its own oldest, and each is counted.
func TestEvictedIDsOfTheSubjectBeingServed(t *testing.T) {
	clock := sluicetest.NewClock()
	s := mustNew(t, Options{Clock: clock, Shards: 1, MaxKeys: 64, SweepInterval: -1})
	p := validPolicy(t, sluice.Policy{ID: "p", Algorithm: sluice.GCRA, Limit: 1e6, Window: time.Second, DedupeMax: 1000, DedupeTTL: time.Hour})
	ctx := context.Background()
	const n = 200
	for i := range n {
		ev := evaluationOf("alice", p, 1)
		ev.EvaluationID = fmt.Sprint("id-", i)
		if err := s.Evaluate(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, held := s.held(""); held != 64 || s.idsLost.Load() != n-64 || s.evictions.Load() != 0 {
		t.Fatalf("%d ids of one subject at a bound of 64: %d held, EvictedIDs %d, Evictions %d; want 64, %d, 0", n, held, s.idsLost.Load(), s.evictions.Load(), n-64)
	}
}
