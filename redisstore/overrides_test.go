package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/overridemap"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

// TestDifferentialOverrides drives one Limiter on memstore (the Go
// engine) and one on Redis (the Lua port) on one fake clock through the
// same spends and peeks while the subject's override changes under them
// (raised, lowered, its window changed, removed), and demands identical
// statuses: both stores carry the state over to new numbers alike.
func TestDifferentialOverrides(t *testing.T) {
	c := standaloneClient(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rs, clock := callerStore(t, c)
			ms, err := memstore.New(memstore.Options{Clock: clock, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ms.Close() })
			policies := []sluice.Policy{{ID: "plan", Algorithm: a, Limit: 100, Window: time.Minute}}
			mem, err := sluice.New(ms, policies, sluice.Options{})
			if err != nil {
				t.Fatal(err)
			}
			red, err := sluice.New(rs, policies, sluice.Options{})
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(seed, uint64(a)))
			subj := subject(t)
			ctx := context.Background()
			var o sluice.Override
			for step := range 1500 {
				if step%40 == 0 {
					o = sluice.Override{Policy: "plan", Subject: subj}
					if r.IntN(4) != 0 { // else removed
						o.Limit = []int64{1, 10, 50, 1000, 5000}[r.IntN(5)]
						o.Window = []time.Duration{0, time.Second, time.Hour}[r.IntN(3)]
						if a == sluice.TokenBucket || a == sluice.GCRA {
							o.Burst = o.Limit * int64(1+r.IntN(2))
						}
					}
					for _, l := range []*sluice.Limiter{mem, red} {
						if err := l.SetOverride(ctx, o); err != nil {
							t.Fatalf("step %d: SetOverride(%+v): %v", step, o, err)
						}
					}
				}
				clock.Advance(time.Duration(r.Int64N(2_000_000)) * time.Microsecond)
				req := sluice.Request{Policy: "plan", Subject: subj, Cost: 1 + r.Int64N(20)}
				if r.IntN(5) == 0 {
					req.Op, req.Cost = sluice.Peek, 0
				}
				if lim := o.Limit; lim != 0 && req.Cost > lim {
					req.Cost = lim
				}
				want, got := mem.Check(ctx, req), red.Check(ctx, req)
				if want.Err != nil || got.Err != nil || want.Status != got.Status {
					t.Fatalf("step %d under %+v: Check(%+v) on Redis = %+v (err %v), memstore %+v (err %v)", step, o, req, got.Status, got.Err, want.Status, want.Err)
				}
			}
		})
	}
}

// TestOverridesStorage: an override put through one store is read by
// another on the same Redis (standalone and the 3-master cluster), the
// note and numbers intact, and its removal too (each through the version
// counter the reader polls).
func TestOverridesStorage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) (*sluice.Limiter, *sluice.Limiter)
	}{
		{"standalone", func(t *testing.T) (*sluice.Limiter, *sluice.Limiter) {
			c := standaloneClient(t)
			return overrideLimiter(t, newStore(t, c, redisOptionsFor(t))), overrideLimiter(t, newStore(t, c, redisOptionsFor(t)))
		}},
		{"cluster", func(t *testing.T) (*sluice.Limiter, *sluice.Limiter) {
			c := clusterClient(t)
			return overrideLimiter(t, newStore(t, c, redisOptionsFor(t))), overrideLimiter(t, newStore(t, c, redisOptionsFor(t)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.store(t)
			ctx := context.Background()
			subj := subject(t)
			want := sluice.Override{Policy: "plan", Subject: subj, Limit: 7, Burst: 9, Window: 90 * time.Second, Note: "acme | gold, 2026"}
			if err := a.SetOverride(ctx, want); err != nil {
				t.Fatal(err)
			}
			if got := findOverride(t, b, subj); got != want {
				t.Fatalf("the other Limiter's Overrides holds %+v, want %+v", got, want)
			}
			if err := a.SetOverride(ctx, sluice.Override{Policy: "plan", Subject: subj}); err != nil {
				t.Fatal(err)
			}
			if got := findOverride(t, b, subj); got != (sluice.Override{}) {
				t.Fatalf("after removal the other Limiter's Overrides holds %+v", got)
			}
		})
	}
}

// redisOptionsFor returns the options of a store with a prefix of t's own.
func redisOptionsFor(t *testing.T) redisstore.Options {
	return redisstore.Options{Prefix: "ovr" + strings.ReplaceAll(t.Name(), "/", ".") + ":"}
}

func overrideLimiter(t *testing.T, s sluice.Store) *sluice.Limiter {
	t.Helper()
	l, err := sluice.New(s, []sluice.Policy{{ID: "plan", Algorithm: sluice.GCRA, Limit: 10, Window: time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// findOverride returns l's override of subj, read from the store now.
func findOverride(t *testing.T, l *sluice.Limiter, subj string) sluice.Override {
	t.Helper()
	list, err := l.Overrides(context.Background())
	if err != nil {
		t.Fatalf("Overrides: %v", err)
	}
	var found sluice.Override
	for _, o := range list {
		if o.Subject == subj {
			found = o
		}
	}
	return found
}

// decisionsOnly is a Store that shows a Limiter only Evaluate, for tests
// that count the commands on the wire: a Limiter over an OverrideStore
// also reads overrides in the background.
type decisionsOnly struct{ s *redisstore.Store }

func (d decisionsOnly) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	return d.s.Evaluate(ctx, ev)
}

// TestOverridesSkipUnreadableFields writes fields redisstore did not
// write into the overrides hash (another tool's, a later sluice's format
// during a rolling upgrade, a broken number) beside a good one: a read
// skips each, reports each once to OnSkippedOverride naming the field and
// the rule (a newer format by its number), and returns the rest. Before,
// one such field failed every read, so no server applied any API
// override.
func TestOverridesSkipUnreadableFields(t *testing.T) {
	c := standaloneClient(t)
	ctx := context.Background()
	var mu sync.Mutex
	var skipped []string
	opts := redisOptionsFor(t)
	opts.OnSkippedOverride = func(err error) {
		mu.Lock()
		defer mu.Unlock()
		skipped = append(skipped, err.Error())
	}
	s := newStore(t, c, opts)
	good := sluice.Override{Policy: "plan", Subject: subject(t), Limit: 3, Note: "tenant"}
	if err := s.PutOverride(ctx, good); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"big:written-by-another-tool": "2|5|0|0|future format",
		"plan\x00other":               "1|five|0|0|",
		"plan\x00short":               "1|5",
	}
	for field, value := range bad {
		if err := c.HSet(ctx, opts.Prefix+"{overrides}", field, value).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Incr(ctx, opts.Prefix+"{overrides}:version").Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second read finds the version unmoved: nothing read, nothing reported again
		list, err := s.Overrides(ctx)
		if err != nil {
			t.Fatalf("Overrides() error = %v, want the readable ones", err)
		}
		if len(list) != 1 || list[0] != good {
			t.Fatalf("Overrides() = %+v, want [%+v]", list, good)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(skipped) != len(bad) {
		t.Fatalf("OnSkippedOverride called %d times (%q), want %d", len(skipped), skipped, len(bad))
	}
	joined := strings.Join(skipped, "\n")
	for _, want := range []string{`"big:written-by-another-tool"`, `format "2"`, `"plan\x00other"`, `"plan\x00short"`} {
		if !strings.Contains(joined, want) {
			t.Errorf("OnSkippedOverride's errors %q do not name %s", skipped, want)
		}
	}
}

// TestOverridesBound: stores with MaxOverrides 5 on one Redis, adding 40
// overrides at once, store exactly 5 (the count and the write are one
// script), each refusal an *overridemap.Full; changing a stored one still
// works, and removing one makes room. On a least-privilege ACL user (the
// package doc's), and after SCRIPT FLUSH (the script is loaded again).
func TestOverridesBound(t *testing.T) {
	t.Run("acl", func(t *testing.T) {
		prefix := "ovrbound:"
		a := redistest.ACL(t, prefix)
		user, admin := a.UserClient(), a.AdminClient()
		t.Cleanup(func() { user.Close(); admin.Close() })
		testOverridesBound(t, user, prefix, func() {
			if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("cluster", func(t *testing.T) {
		testOverridesBound(t, clusterClient(t), redisOptionsFor(t).Prefix, func() {})
	})
}

func testOverridesBound(t *testing.T, c redis.UniversalClient, prefix string, flush func()) {
	ctx := context.Background()
	opts := redisstore.Options{Prefix: prefix, MaxOverrides: 5}
	stores := []*redisstore.Store{newStore(t, c, opts), newStore(t, c, opts)}
	var wg sync.WaitGroup
	errs := make([]error, 40)
	for i := range errs {
		wg.Go(func() {
			errs[i] = stores[i%2].PutOverride(ctx, sluice.Override{Policy: "plan", Subject: fmt.Sprint("s", i), Limit: 3})
		})
	}
	wg.Wait()
	var stored []string
	for i, err := range errs {
		var full *overridemap.Full
		switch {
		case err == nil:
			stored = append(stored, fmt.Sprint("s", i))
		case !errors.As(err, &full) || full.Max != 5 || full.Stored != 5:
			t.Fatalf("PutOverride(s%d) = %v, want nil or 5 overrides stored, at most 5", i, err)
		}
	}
	list, err := stores[0].Overrides(ctx)
	if err != nil || len(stored) != 5 || len(list) != 5 {
		t.Fatalf("%d puts succeeded, Overrides() = %d (%v), want 5 and 5", len(stored), len(list), err)
	}
	flush()
	for _, step := range []struct {
		o    sluice.Override
		full bool
	}{
		{sluice.Override{Policy: "plan", Subject: stored[0], Limit: 9}, false}, // a change
		{sluice.Override{Policy: "plan", Subject: "new", Limit: 9}, true},
		{sluice.Override{Policy: "plan", Subject: stored[1]}, false}, // a removal
		{sluice.Override{Policy: "plan", Subject: "new", Limit: 9}, false},
	} {
		var full *overridemap.Full
		if err := stores[1].PutOverride(ctx, step.o); errors.As(err, &full) != step.full || (err != nil && full == nil) {
			t.Fatalf("PutOverride(%+v) = %v, want full %v", step.o, err, step.full)
		}
	}
}
