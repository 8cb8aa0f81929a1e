package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// newStoreFunc returns a fresh Store whose decisions read clock.
type newStoreFunc = func(t *testing.T, clock sluice.Clock) sluice.Store

// TestStore runs the behavioural suite against the stores newStore makes.
// Every sluice.Store must pass it; third-party stores may run it too.
// The suite calls newStore once per subtest with the fake clock the
// subtest moves; the store is the callee's to close (t.Cleanup). Subjects
// are unique per subtest, so stores may share a backend.
func TestStore(t *testing.T, newStore func(t *testing.T, clock sluice.Clock) sluice.Store) {
	t.Run("FixedWindowThreePerTenSeconds", func(t *testing.T) { testFixedWindowSeed(t, newStore) })
	t.Run("SubjectsAreIndependent", func(t *testing.T) { testSubjectsIndependent(t, newStore) })
	t.Run("SlidingWindowWeightedEstimate", func(t *testing.T) { testSlidingWindowSeed(t, newStore) })
	t.Run("BoundaryBurst", func(t *testing.T) { testBoundaryBurst(t, newStore) })
	t.Run("TokenBucketRefill", func(t *testing.T) { testTokenBucket(t, newStore) })
	t.Run("GCRABurstThenRate", func(t *testing.T) { testGCRA(t, newStore) })
	t.Run("SlidingLogSameMicrosecond", func(t *testing.T) { testSlidingLogSameMicrosecond(t, newStore) })
	t.Run("SubMillisecond", func(t *testing.T) { testSubMillisecond(t, newStore) })
	t.Run("ConcurrentExactlyLimit", func(t *testing.T) { testConcurrent(t, newStore) })
	t.Run("ClockJumpsBackwards", func(t *testing.T) { testJumpBackwards(t, newStore) })
	t.Run("RetryAfterBehindTheClockIsNeverEarly", func(t *testing.T) { testRegressionRetryAfter(t, newStore) })
	t.Run("PeekSpendsNothing", func(t *testing.T) { testPeek(t, newStore) })
	t.Run("MultiPolicyAllOrNothing", func(t *testing.T) { testMultiPolicy(t, newStore) })
	t.Run("RetryAfterIsExact", func(t *testing.T) { testRetryAfterExact(t, newStore) })
	t.Run("RevisionStartsFresh", func(t *testing.T) { testRevision(t, newStore) })
	t.Run("FixedWindowAlignedToTheClock", func(t *testing.T) { testAligned(t, newStore) })
	t.Run("ResetClearsTheNamedPolicies", func(t *testing.T) { testReset(t, newStore) })
	t.Run("DoneContextSpendsNothing", func(t *testing.T) { testDoneContext(t, newStore) })
	t.Run("KeyRotationCarriesState", func(t *testing.T) { testKeyRotation(t, newStore) })
	t.Run("HeldSpendPassesThrough", func(t *testing.T) { testHeld(t, newStore) })
	t.Run("BookSlots", func(t *testing.T) { testBook(t, newStore) })
	testSemantics(t, newStore)
	testConcurrency(t, newStore)
	testOverrides(t, newStore)
	testCalendar(t, newStore)
	t.Run("Priorities", func(t *testing.T) { testPriorities(t, newStore) })
}

// Policies used by the suite. Windows are whole seconds or less so that
// windows aligned to the epoch (sliding_window) are aligned to start.
func policy(id string, a sluice.Algorithm, limit int64, window time.Duration, burst int64) sluice.Policy {
	return sluice.Policy{ID: id, Algorithm: a, Limit: limit, Window: window, Burst: burst}
}

var everyAlgorithm = []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA}

var subjectSeq atomic.Int64

// harness is one store, one limiter and one fake clock for a subtest.
type harness struct {
	t       *testing.T
	clock   *Clock
	store   sluice.Store
	limiter *sluice.Limiter
	subject string
}

func newHarness(t *testing.T, newStore newStoreFunc, policies ...sluice.Policy) *harness {
	t.Helper()
	clock := NewClock()
	store := newStore(t, clock)
	l, err := sluice.New(store, policies, sluice.Options{})
	if err != nil {
		t.Fatalf("sluice.New: %v", err)
	}
	return &harness{t: t, clock: clock, store: store, limiter: l, subject: uniqueSubject(t, "s")}
}

// uniqueSubject returns a key-safe subject no other subtest or run uses.
func uniqueSubject(t *testing.T, tag string) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	if len(name) > 80 {
		name = name[len(name)-80:]
	}
	return fmt.Sprintf("sluicetest:%s:%s:%d:%d", name, tag, rand.Int64(), subjectSeq.Add(1))
}

// step is one row of a scenario: move the clock, then check.
type step struct {
	name    string
	advance time.Duration
	policy  string
	cost    int64 // 0 = 1; use peek for a peek
	peek    bool
	want    want
}

type want struct {
	kind       sluice.Kind
	remaining  int64
	retryAfter time.Duration
	resetAfter time.Duration
}

func (h *harness) check(policy string, cost int64, peek bool) sluice.Outcome {
	op := sluice.Spend
	if peek {
		op = sluice.Peek
	}
	return h.limiter.Check(context.Background(), sluice.Request{Op: op, Policy: policy, Subject: h.subject, Cost: cost})
}

func (h *harness) run(steps []step) {
	h.t.Helper()
	for _, s := range steps {
		h.clock.Advance(s.advance)
		o := h.check(s.policy, s.cost, s.peek)
		got := want{o.Kind, o.Remaining, o.RetryAfter, o.ResetAfter}
		if got != s.want {
			h.t.Fatalf("%s: Check(%q, cost=%d, peek=%v) = %+v (err %v), want %+v", s.name, s.policy, s.cost, s.peek, got, o.Err, s.want)
		}
	}
}

// expect fails unless o has kind k.
func expect(t *testing.T, what string, o sluice.Outcome, k sluice.Kind) {
	t.Helper()
	if o.Kind != k {
		t.Fatalf("%s = %v (err %v, status %+v), want %v", what, o.Kind, o.Err, o.Status, k)
	}
}

func testFixedWindowSeed(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("demo", sluice.FixedWindow, 3, 10*time.Second, 0))
	h.run([]step{
		{"first", 0, "demo", 1, false, want{sluice.Allowed, 2, 0, 10 * time.Second}},
		{"second", time.Second, "demo", 1, false, want{sluice.Allowed, 1, 0, 9 * time.Second}},
		{"third", time.Second, "demo", 1, false, want{sluice.Allowed, 0, 0, 8 * time.Second}},
		{"fourth denied, retry when the window ends", 500 * time.Millisecond, "demo", 1, false, want{sluice.Denied, 0, 7500 * time.Millisecond, 7500 * time.Millisecond}},
		{"denial moved neither count nor expiry", time.Second, "demo", 1, false, want{sluice.Denied, 0, 6500 * time.Millisecond, 6500 * time.Millisecond}},
		{"one microsecond before the end", 6500*time.Millisecond - time.Microsecond, "demo", 1, false, want{sluice.Denied, 0, time.Microsecond, time.Microsecond}},
		{"new window after expiry", time.Microsecond, "demo", 1, false, want{sluice.Allowed, 2, 0, 10 * time.Second}},
		{"cost 2 fits exactly", 0, "demo", 2, false, want{sluice.Allowed, 0, 0, 10 * time.Second}},
	})
}

func testSubjectsIndependent(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("demo", sluice.FixedWindow, 3, 10*time.Second, 0))
	for i := 0; i < 3; i++ {
		expect(t, "alice's spend", h.check("demo", 1, false), sluice.Allowed)
	}
	expect(t, "alice's fourth", h.check("demo", 1, false), sluice.Denied)
	h.subject = uniqueSubject(t, "bob")
	o := h.check("demo", 1, false)
	if o.Kind != sluice.Allowed || o.Remaining != 2 {
		t.Fatalf("bob's first = %+v, want allowed with remaining 2", o)
	}
}

func testSlidingWindowSeed(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("api", sluice.SlidingWindow, 100, time.Minute, 0))
	// Previous window [start-1m, start): 84 units. Current window from start.
	h.clock.Set(start.Add(-time.Minute + 10*time.Second))
	expect(t, "84 in the previous window", h.check("api", 84, false), sluice.Allowed)
	// At 25 % of the current window the previous one weighs 84 × 0.75 = 63;
	// 36 more make the estimate 99.
	h.clock.Set(start.Add(15 * time.Second))
	o := h.check("api", 36, false)
	if o.Kind != sluice.Allowed || o.Remaining != 1 || !o.Approximate {
		t.Fatalf("36 at 25%% elapsed = %+v, want allowed, remaining 1 (estimate 99 of 100), approximate", o)
	}
	h.run([]step{
		{"peek sees the estimate", 0, "api", 0, true, want{sluice.Allowed, 1, 0, 105 * time.Second}},
		{"the hundredth", 0, "api", 1, false, want{sluice.Allowed, 0, 0, 105 * time.Second}},
		// Denied until 84 × (60 − e)/60 + 37 + 1 ≤ 100, e ≥ 60 − ⌊62·60/84⌋ = 15.714286s.
		{"the next waits for the decay", 0, "api", 1, false, want{sluice.Denied, 0, 714286 * time.Microsecond, 105 * time.Second}},
		{"one µs early", 714285 * time.Microsecond, "api", 1, false, want{sluice.Denied, 0, time.Microsecond, 105*time.Second - 714285*time.Microsecond}},
		{"on time", time.Microsecond, "api", 1, false, want{sluice.Allowed, 0, 0, 105*time.Second - 714286*time.Microsecond}},
	})
}

// testBoundaryBurst shows the fixed window's 2× burst across a boundary and
// the sliding log's exact bound in every window-length interval.
func testBoundaryBurst(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore,
		policy("fixed", sluice.FixedWindow, 10, 10*time.Second, 0),
		policy("log", sluice.SlidingLog, 10, 10*time.Second, 0))
	admitted := func(id string) []time.Time {
		h.subject = uniqueSubject(t, id)
		h.clock.Set(start)
		var at []time.Time
		expect(t, "opening request", h.check(id, 1, false), sluice.Allowed)
		at = append(at, h.clock.Now())
		// Bursts of 20 just before and just after the fixed window's end.
		for _, offset := range []time.Duration{0, 200 * time.Millisecond} {
			h.clock.Set(start.Add(9900*time.Millisecond + offset))
			for i := 0; i < 20; i++ {
				if o := h.check(id, 1, false); o.Kind == sluice.Allowed {
					at = append(at, h.clock.Now())
				}
			}
		}
		return at
	}
	// The window opened with the first request, so 9 of its 10 units remain
	// for the burst just before it closes, and 10 more open right after:
	// 19 admitted within 200ms, nearly twice the limit.
	fixed := admitted("fixed")
	if got := maxInInterval(fixed, time.Second); got != 19 {
		t.Errorf("fixed window admitted at most %d within one second across the boundary, want 19 (2 × limit − the opening request)", got)
	}
	log := admitted("log")
	if got := maxInInterval(log, 10*time.Second); got != 10 {
		t.Errorf("sliding log admitted at most %d in a 10s interval, want exactly the limit 10", got)
	}
}

// maxInInterval returns the most times that fit in a half-open interval of
// length w.
func maxInInterval(at []time.Time, w time.Duration) int {
	best := 0
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j].Sub(at[i]) < w; j++ {
			n++
		}
		best = max(best, n)
	}
	return best
}

func testTokenBucket(t *testing.T, newStore newStoreFunc) {
	// Capacity 10, refilling 2 per second.
	h := newHarness(t, newStore, policy("bucket", sluice.TokenBucket, 2, time.Second, 10))
	h.run([]step{
		{"burst of 10 at once", 0, "bucket", 10, false, want{sluice.Allowed, 0, 0, 5 * time.Second}},
		{"empty: one token in 500ms", 0, "bucket", 1, false, want{sluice.Denied, 0, 500 * time.Millisecond, 5 * time.Second}},
		{"refilled one", 500 * time.Millisecond, "bucket", 1, false, want{sluice.Allowed, 0, 0, 5 * time.Second}},
		{"three need 1.5s", 0, "bucket", 3, false, want{sluice.Denied, 0, 1500 * time.Millisecond, 5 * time.Second}},
		{"refill caps at capacity", time.Hour, "bucket", 0, true, want{sluice.Allowed, 10, 0, 0}},
		{"spend 4 of 10", 0, "bucket", 4, false, want{sluice.Allowed, 6, 0, 2 * time.Second}},
	})
}

func testGCRA(t *testing.T, newStore newStoreFunc) {
	// 10 per second (one every 100ms), burst 5.
	h := newHarness(t, newStore, policy("gcra", sluice.GCRA, 10, time.Second, 5))
	steps := []step{}
	for i := int64(1); i <= 5; i++ {
		steps = append(steps, step{fmt.Sprintf("burst %d", i), 0, "gcra", 1, false, want{sluice.Allowed, 5 - i, 0, time.Duration(i) * 100 * time.Millisecond}})
	}
	steps = append(steps,
		step{"sixth waits one interval", 0, "gcra", 1, false, want{sluice.Denied, 0, 100 * time.Millisecond, 500 * time.Millisecond}},
		step{"steady 1", 100 * time.Millisecond, "gcra", 1, false, want{sluice.Allowed, 0, 0, 500 * time.Millisecond}},
		step{"too early", 50 * time.Millisecond, "gcra", 1, false, want{sluice.Denied, 0, 50 * time.Millisecond, 450 * time.Millisecond}},
		step{"steady 2", 50 * time.Millisecond, "gcra", 1, false, want{sluice.Allowed, 0, 0, 500 * time.Millisecond}},
	)
	h.run(steps)
}

func testSlidingLogSameMicrosecond(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("log", sluice.SlidingLog, 5, time.Second, 0))
	for i := int64(1); i <= 5; i++ {
		o := h.check("log", 1, false)
		if o.Kind != sluice.Allowed || o.Remaining != 5-i {
			t.Fatalf("request %d in the same µs = %+v, want allowed with remaining %d", i, o, 5-i)
		}
	}
	expect(t, "sixth in the same µs", h.check("log", 1, false), sluice.Denied)
	h.clock.Advance(time.Second)
	o := h.check("log", 0, true)
	if o.Remaining != 5 {
		t.Fatalf("after the window, peek = %+v, want all 5 entries expired together", o)
	}
}

func testSubMillisecond(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore,
		policy("ms", sluice.FixedWindow, 1, time.Millisecond, 0),
		policy("fast", sluice.TokenBucket, 100_000, time.Second, 1),
		policy("fastgcra", sluice.GCRA, 100_000, time.Second, 1),
		policy("mslog", sluice.SlidingLog, 2, time.Millisecond, 0))
	h.run([]step{
		{"1/ms first", 0, "ms", 1, false, want{sluice.Allowed, 0, 0, time.Millisecond}},
		{"1/ms second", 400 * time.Microsecond, "ms", 1, false, want{sluice.Denied, 0, 600 * time.Microsecond, 600 * time.Microsecond}},
		{"1/ms next window", 600 * time.Microsecond, "ms", 1, false, want{sluice.Allowed, 0, 0, time.Millisecond}},
		{"100k/s bucket", 0, "fast", 1, false, want{sluice.Allowed, 0, 0, 10 * time.Microsecond}},
		{"100k/s bucket 9µs later", 9 * time.Microsecond, "fast", 1, false, want{sluice.Denied, 0, time.Microsecond, time.Microsecond}},
		{"100k/s bucket 10µs later", time.Microsecond, "fast", 1, false, want{sluice.Allowed, 0, 0, 10 * time.Microsecond}},
		{"100k/s gcra", 0, "fastgcra", 1, false, want{sluice.Allowed, 0, 0, 10 * time.Microsecond}},
		{"100k/s gcra 3µs later", 3 * time.Microsecond, "fastgcra", 1, false, want{sluice.Denied, 0, 7 * time.Microsecond, 7 * time.Microsecond}},
		{"2/ms log", 0, "mslog", 2, false, want{sluice.Allowed, 0, 0, time.Millisecond}},
		{"2/ms log 999µs later", 999 * time.Microsecond, "mslog", 1, false, want{sluice.Denied, 0, time.Microsecond, time.Microsecond}},
	})
}

func testConcurrent(t *testing.T, newStore newStoreFunc) {
	const limit, callers = 10, 40
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("p", a, limit, time.Minute, 0))
			var admitted atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make(chan sluice.Outcome, callers)
			for i := 0; i < callers; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					switch o := h.check("p", 1, false); o.Kind {
					case sluice.Allowed:
						admitted.Add(1)
					case sluice.Denied:
					default:
						errs <- o
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for o := range errs {
				t.Errorf("concurrent Check = %v (%v), want allowed or denied", o.Kind, o.Err)
			}
			if got := admitted.Load(); got != limit {
				t.Fatalf("%d concurrent callers: %d admitted, want exactly %d", callers, got, limit)
			}
		})
	}
}

func testJumpBackwards(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("p", a, 3, 10*time.Second, 0))
			h.clock.Set(start.Add(5 * time.Second))
			expect(t, "spend all", h.check("p", 3, false), sluice.Allowed)
			for _, back := range []time.Duration{-time.Microsecond, -3 * time.Second, -time.Hour} {
				h.clock.Set(start.Add(5 * time.Second).Add(back))
				o := h.check("p", 1, false)
				if o.Kind != sluice.Denied || o.RetryAfter <= 0 {
					t.Fatalf("clock %v behind: Check = %+v (err %v), want denied with a positive retry: a clock going back must not reset state", -back, o, o.Err)
				}
			}
			// Forward again: the state is intact and recovers on schedule.
			h.clock.Set(start.Add(5 * time.Second))
			o := h.check("p", 1, false)
			if o.Kind != sluice.Denied {
				t.Fatalf("back at the spend instant: %+v, want denied", o)
			}
			h.clock.Advance(o.RetryAfter)
			expect(t, "after the retry", h.check("p", 1, false), sluice.Allowed)
		})
	}
}

// testRegressionRetryAfter: a request whose time lies behind the newest
// write (another instance's clock, a clock stepped back) gets a RetryAfter
// measured from its own time: waiting exactly that long is admitted, 1µs
// less is not. 1 per second, spent at T (a window boundary); asked at
// T−500ms: 1.5s, or 2.5s for sliding_window, whose estimate weighs the
// unit fully until the next window starts and decays it over that one.
func testRegressionRetryAfter(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			want := 1500 * time.Millisecond
			if a == sluice.SlidingWindow {
				want = 2500 * time.Millisecond
			}
			h := newHarness(t, newStore, policy("p", a, 1, time.Second, 0))
			at := start.Add(10 * time.Second)
			h.clock.Set(at)
			expect(t, "spend at T", h.check("p", 1, false), sluice.Allowed)
			h.clock.Set(at.Add(-500 * time.Millisecond))
			o := h.check("p", 1, false)
			if o.Kind != sluice.Denied || o.RetryAfter != want {
				t.Fatalf("Check at T-500ms = %+v (err %v), want denied with RetryAfter %v: measured from the request's own time", o, o.Err, want)
			}
			h.clock.Set(at.Add(-500 * time.Millisecond).Add(o.RetryAfter - time.Microsecond))
			expect(t, "1µs before RetryAfter", h.check("p", 1, false), sluice.Denied)
			h.clock.Set(at.Add(-500 * time.Millisecond).Add(o.RetryAfter))
			expect(t, "at RetryAfter", h.check("p", 1, false), sluice.Allowed)
		})
	}
}

func testPeek(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("p", a, 4, 10*time.Second, 0))
			h.clock.Set(start.Add(time.Second))
			fresh := h.check("p", 0, true)
			if fresh.Kind != sluice.Allowed || fresh.Remaining != 4 || fresh.ResetAfter != 0 {
				t.Fatalf("peek of absent state = %+v, want allowed, remaining 4, reset 0", fresh)
			}
			expect(t, "spend 3", h.check("p", 3, false), sluice.Allowed)
			first := h.check("p", 0, true)
			for i := 0; i < 5; i++ {
				if o := h.check("p", 0, true); o.Status != first.Status || o.Kind != first.Kind {
					t.Fatalf("peek %d = %+v, want %+v: a peek must not change state", i, o, first)
				}
			}
			if first.Remaining != 1 {
				t.Fatalf("peek after spending 3 of 4 = %+v, want remaining 1", first)
			}
			expect(t, "spend the last", h.check("p", 1, false), sluice.Allowed)
			o := h.check("p", 0, true)
			if o.Kind != sluice.Denied || o.RetryAfter <= 0 || o.Remaining != 0 {
				t.Fatalf("peek when exhausted = %+v, want denied with a retry", o)
			}
		})
	}
}

func testMultiPolicy(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore,
		policy("second", sluice.FixedWindow, 2, time.Second, 0),
		policy("hour", sluice.SlidingLog, 5, time.Hour, 0),
		policy("bucket", sluice.TokenBucket, 1, time.Second, 10))
	multi := func(cost int64) sluice.Outcome {
		return h.limiter.Check(context.Background(), sluice.Request{Policies: []string{"second", "hour", "bucket"}, Subject: h.subject, Cost: cost})
	}
	o := multi(2)
	if o.Kind != sluice.Allowed || len(o.Statuses) != 3 || o.Policy != "second" {
		t.Fatalf("first multi = %+v, want allowed with 3 statuses, most restrictive \"second\" (remaining 0)", o)
	}
	// "second" is exhausted: the next request must spend on nothing.
	before := map[string]int64{}
	for _, id := range []string{"hour", "bucket"} {
		before[id] = h.check(id, 0, true).Remaining
	}
	o = multi(1)
	if o.Kind != sluice.Denied || o.Policy != "second" || o.Statuses[0].Allowed || !o.Statuses[1].Allowed || !o.Statuses[2].Allowed {
		t.Fatalf("multi with \"second\" exhausted = %+v, want denied by \"second\" only", o)
	}
	for i, id := range []string{"hour", "bucket"} {
		if got := h.check(id, 0, true).Remaining; got != before[id] {
			t.Fatalf("%s remaining after a denied multi-policy request = %d, want %d (nothing spent)", id, got, before[id])
		}
		if got := o.Statuses[i+1]; got.Remaining != before[id] || got.RetryAfter != 0 {
			t.Fatalf("%s status in the denied multi-policy answer = %+v, want remaining %d as unspent, no retry", id, got, before[id])
		}
	}
	// A second later "second" admits again; after 5 units "hour" denies.
	h.clock.Advance(time.Second)
	expect(t, "multi after a second", multi(2), sluice.Allowed)
	h.clock.Advance(time.Second)
	o = multi(2)
	if o.Kind != sluice.Denied || o.Policy != "hour" || o.RetryAfter <= 58*time.Minute {
		t.Fatalf("multi past the hourly limit = %+v, want denied by \"hour\" for about an hour", o)
	}
}

// testRetryAfterExact drives random costs at random times and, after every
// denial, checks that the request is still denied 1µs before RetryAfter
// and admitted exactly at it.
func testRetryAfterExact(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			p := policy("p", a, 7, 3*time.Second, 0)
			if a == sluice.TokenBucket || a == sluice.GCRA {
				p.Burst = 4
			}
			h := newHarness(t, newStore, p)
			p, _ = h.limiter.Policy("p")
			rng := rand.New(rand.NewPCG(uint64(a), 42))
			denials := 0
			for i := 0; i < 150 && denials < 25; i++ {
				h.clock.Advance(time.Duration(rng.Int64N(int64(800 * time.Millisecond))))
				cost := 1 + rng.Int64N(p.MaxCost)
				o := h.check("p", cost, false)
				if o.Kind == sluice.Allowed {
					continue
				}
				if o.Kind != sluice.Denied || o.RetryAfter <= 0 {
					t.Fatalf("step %d: Check(cost=%d) = %+v (err %v), want allowed, or denied with a positive retry", i, cost, o, o.Err)
				}
				denials++
				wait := o.RetryAfter
				h.clock.Advance(wait - time.Microsecond)
				if e := h.check("p", cost, false); e.Kind != sluice.Denied {
					t.Fatalf("step %d: cost %d admitted 1µs before RetryAfter %v: %+v", i, cost, wait, e)
				}
				h.clock.Advance(time.Microsecond)
				if e := h.check("p", cost, false); e.Kind != sluice.Allowed {
					t.Fatalf("step %d: cost %d denied at RetryAfter %v: %+v", i, cost, wait, e)
				}
			}
			if denials == 0 {
				t.Fatalf("no denial in the random run: the test proved nothing")
			}
		})
	}
}

func testRevision(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("demo", sluice.FixedWindow, 1, time.Minute, 0))
	expect(t, "revision 1", h.check("demo", 1, false), sluice.Allowed)
	expect(t, "revision 1 again", h.check("demo", 1, false), sluice.Denied)
	p := policy("demo", sluice.FixedWindow, 1, time.Minute, 0)
	p.Revision = 2
	l2, err := sluice.New(h.store, []sluice.Policy{p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := l2.Check(context.Background(), sluice.Request{Policy: "demo", Subject: h.subject})
	expect(t, "revision 2 starts fresh", o, sluice.Allowed)
}

// testAligned: a fixed window with ClockAligned opens on the UTC minute
// (the clock starts at a midnight), resets at the next one, and keeps a
// state apart from the same policy's first-request windows.
func testAligned(t *testing.T, newStore newStoreFunc) {
	p := policy("minute", sluice.FixedWindow, 3, time.Minute, 0)
	p.ClockAligned = true
	h := newHarness(t, newStore, p)
	h.run([]step{
		{"20s into the minute: resets at the minute", 20 * time.Second, "minute", 1, false, want{sluice.Allowed, 2, 0, 40 * time.Second}},
		{"two more", 39 * time.Second, "minute", 2, false, want{sluice.Allowed, 0, 0, time.Second}},
		{"denied until the minute", 500 * time.Millisecond, "minute", 1, false, want{sluice.Denied, 0, 500 * time.Millisecond, 500 * time.Millisecond}},
		{"the next minute", 500 * time.Millisecond, "minute", 1, false, want{sluice.Allowed, 2, 0, time.Minute}},
	})
	p.ClockAligned = false
	l2, err := sluice.New(h.store, []sluice.Policy{p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := l2.Check(context.Background(), sluice.Request{Policy: "minute", Subject: h.subject})
	if o.Kind != sluice.Allowed || o.Remaining != 2 || o.ResetAfter != time.Minute {
		t.Fatalf("first-request windows after aligned ones = %+v, want fresh state: allowed, 2 left, a minute from now", o.Status)
	}
}

// testReset: a subject denied by every algorithm is reset on some
// policies: those start fresh, at once and together; the others keep
// their state; resetting a subject with no state is harmless.
func testReset(t *testing.T, newStore newStoreFunc) {
	var ps []sluice.Policy
	var ids []string
	for _, a := range everyAlgorithm {
		ps = append(ps, policy(a.String(), a, 2, time.Hour, 0))
		ids = append(ids, a.String())
	}
	h := newHarness(t, newStore, ps...)
	for _, id := range ids {
		expect(t, id+": spend all", h.check(id, 2, false), sluice.Allowed)
		expect(t, id+": then denied", h.check(id, 1, false), sluice.Denied)
	}
	ctx := context.Background()
	o := h.limiter.Check(ctx, sluice.Request{Op: sluice.Reset, Policies: ids[:3], Subject: h.subject})
	if o.Kind != sluice.Allowed || len(o.Statuses) != 3 {
		t.Fatalf("Reset(%v) = %+v (err %v), want allowed with 3 statuses", ids[:3], o, o.Err)
	}
	for _, st := range o.Statuses {
		if !st.Allowed || st.Remaining != 2 || st.ResetAfter != 0 {
			t.Fatalf("Reset status %+v, want fresh state: allowed, 2 remaining, nothing to reset", st)
		}
	}
	for i, id := range ids {
		want := sluice.Denied
		if i < 3 {
			want = sluice.Allowed
		}
		expect(t, id+" after resetting "+strings.Join(ids[:3], ","), h.check(id, 1, false), want)
	}
	if o := h.limiter.Check(ctx, sluice.Request{Op: sluice.Reset, Policies: h.limiter.Policies(), Subject: h.subject}); o.Kind != sluice.Allowed || len(o.Statuses) != len(ids) {
		t.Fatalf("Reset of every policy = %+v (err %v), want allowed with %d statuses", o, o.Err, len(ids))
	}
	for _, id := range ids {
		expect(t, id+" after resetting all", h.check(id, 2, false), sluice.Allowed)
	}
	if o := h.limiter.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: ids[0], Subject: uniqueSubject(t, "never")}); o.Kind != sluice.Allowed {
		t.Fatalf("Reset of a subject with no state = %+v (err %v), want allowed", o, o.Err)
	}
	bad := h.limiter.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: ids[0], Subject: h.subject, Cost: 1})
	if bad.Kind != sluice.Incompatible || !errors.Is(bad.Err, sluice.ErrInvalidRequest) {
		t.Fatalf("reset with a cost = %+v, want Incompatible: a reset takes no cost", bad)
	}
}

// testKeyRotation: while a new HMAC key is added, a caller's state kept
// under its older pseudonym is carried over to the new one, not started
// afresh; a reset clears both.
func testKeyRotation(t *testing.T, newStore newStoreFunc) {
	for _, a := range everyAlgorithm {
		t.Run(a.String(), func(t *testing.T) {
			h := newHarness(t, newStore, policy("p", a, 4, time.Hour, 0))
			ctx := context.Background()
			check := func(subject string, previous []string, cost int64) sluice.Outcome {
				return h.limiter.Check(ctx, sluice.Request{Policy: "p", Subject: subject, Previous: previous, Cost: cost})
			}
			old, neu, absent := uniqueSubject(t, "old"), uniqueSubject(t, "new"), uniqueSubject(t, "absent")
			if o := check(old, nil, 3); o.Kind != sluice.Allowed || o.Remaining != 1 {
				t.Fatalf("Check(old, cost=3) = %+v (err %v), want allowed with 1 left", o, o.Err)
			}
			h.clock.Advance(time.Second)
			if o := check(neu, []string{absent, old}, 1); o.Kind != sluice.Allowed || o.Remaining != 0 {
				t.Fatalf("Check(new, previous [absent, old], cost=1) = %+v (err %v), want allowed with 0 left: the old state carried over", o, o.Err)
			}
			if o := check(neu, nil, 1); o.Kind != sluice.Denied {
				t.Fatalf("Check(new, cost=1) with no previous = %+v (err %v), want denied: the carried state is kept under the new subject", o, o.Err)
			}
			if o := check(neu, []string{old}, 1); o.Kind != sluice.Denied {
				t.Fatalf("Check(new, previous [old]) = %+v (err %v), want denied: a state under the new subject is never replaced", o, o.Err)
			}
			o := h.limiter.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: "p", Subject: neu, Previous: []string{old}})
			if o.Kind != sluice.Allowed {
				t.Fatalf("reset with previous = %+v (err %v), want allowed", o, o.Err)
			}
			if o := check(neu, []string{old}, 1); o.Kind != sluice.Allowed || o.Remaining != 3 {
				t.Fatalf("Check(new, previous [old]) after the reset = %+v (err %v), want allowed with 3 left: both states cleared", o, o.Err)
			}
			if o := check(neu, []string{neu}, 1); o.Kind != sluice.Incompatible || !errors.Is(o.Err, sluice.ErrInvalidRequest) {
				t.Fatalf("Check with the subject among previous = %+v, want Incompatible", o)
			}
		})
	}
}

func testDoneContext(t *testing.T, newStore newStoreFunc) {
	h := newHarness(t, newStore, policy("demo", sluice.FixedWindow, 1, time.Minute, 0))
	p, _ := h.limiter.Policy("demo")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ev := &sluice.Evaluation{Subject: h.subject, Policies: []*sluice.Policy{&p}, Cost: 1}
	if err := h.store.Evaluate(ctx, ev); !errors.Is(err, context.Canceled) {
		t.Fatalf("Evaluate with a cancelled context = %v, want an error wrapping context.Canceled", err)
	}
	expect(t, "the budget after a cancelled call", h.check("demo", 1, false), sluice.Allowed)
}
