package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// TestMemoryUsage measures, with MEMORY USAGE, the bytes one subject's
// state takes per algorithm after typical use, and logs a table (go test
// -v -run TestMemoryUsage). It asserts only that every state is small.
func TestMemoryUsage(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	cases := []struct {
		name  string
		alg   sluice.Algorithm
		limit int64
		spend int64 // units admitted, one request each
	}{
		{"fixed_window, after 1 request", sluice.FixedWindow, 100, 1},
		{"sliding_window, after 1 request", sluice.SlidingWindow, 100, 1},
		{"token_bucket, after 1 request", sluice.TokenBucket, 100, 1},
		{"gcra, after 1 request", sluice.GCRA, 100, 1},
		{"sliding_log, 1 entry", sluice.SlidingLog, 1000, 1},
		{"sliding_log, 100 entries", sluice.SlidingLog, 1000, 100},
		{"sliding_log, 1000 entries", sluice.SlidingLog, 1000, 1000},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n| state (subject of 43 bytes, policy id %q) | key bytes | MEMORY USAGE bytes |\n|---|---|---|\n", "api")
	for i, tc := range cases {
		p := policy(t, "api", tc.alg, tc.limit, time.Hour)
		subj := fmt.Sprintf("k1.%040d", i) // a pseudonym's length
		key := s.Key(subj, p)
		c.Del(ctx, key)
		for range tc.spend {
			mustEvaluate(t, s, subj, 1, p)
		}
		n, err := c.MemoryUsage(ctx, key, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&table, "| %s | %d | %d |\n", tc.name, len(key), n)
		if n > 64*tc.spend+200 {
			t.Errorf("%s: MEMORY USAGE %d bytes, more than expected", tc.name, n)
		}
	}
	// Evaluation ids: the two record keys of one subject and policy with
	// 1 and with 256 (the default DedupeMax) remembered ids.
	p := policy(t, "api", sluice.GCRA, 1_000_000, time.Hour)
	for _, ids := range []int{1, 256} {
		subj := fmt.Sprintf("k1.%040d", 100+ids)
		for i := range ids {
			ev := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, Cost: 1, EvaluationID: fmt.Sprintf("req-%016x", i)}
			if err := s.Evaluate(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		var n int64
		for _, suffix := range []string{"ids", "idv"} {
			m, err := c.MemoryUsage(ctx, "sluice:{"+subj+"}api:1:"+suffix, 0).Result()
			if err != nil {
				t.Fatalf("MEMORY USAGE of the %s key: %v", suffix, err)
			}
			n += m
		}
		fmt.Fprintf(&table, "| evaluation ids, %d remembered (20-byte ids) | both keys | %d (%d per id) |\n", ids, n, n/int64(ids))
	}
	t.Log(table.String())
}

// BenchmarkEvaluate measures one decision per algorithm on the shared
// standalone server, serially (also under a 500ms deadline of the
// caller's, as the check API and the middleware set one) and from 64
// concurrent callers (b.SetParallelism(64 / GOMAXPROCS)), each caller on
// its own subject.
func BenchmarkEvaluate(b *testing.B) {
	c := standaloneClient(b)
	s := newStore(b, c, redisstore.Options{})
	for _, a := range algorithms {
		limit := int64(1_000_000)
		if a == sluice.SlidingLog {
			limit = 100_000 // its most: the log keeps one entry per admitted unit
		}
		p := policy(b, "bench", a, limit, time.Second)
		for _, deadline := range []time.Duration{0, 500 * time.Millisecond} {
			name := "/serial"
			if deadline > 0 {
				name = "/serial-deadline"
			}
			b.Run(a.String()+name, func(b *testing.B) {
				subj := subject(b)
				ev := formed(&sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{p}, Cost: 1}, false)
				b.ReportAllocs()
				cpu := redisCPU(b, c)
				for b.Loop() {
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if deadline > 0 {
						ctx, cancel = context.WithTimeout(ctx, deadline)
					}
					err := s.Evaluate(ctx, ev)
					cancel()
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				b.ReportMetric((redisCPU(b, c)-cpu)/float64(b.N), "redis-µs/decision")
			})
		}
		b.Run(a.String()+"/parallel64", func(b *testing.B) {
			procs := runtime.GOMAXPROCS(0)
			b.SetParallelism(max(64/procs, 1))
			var seq atomic.Int64
			base := subject(b)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := redisCPU(b, c)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ev := formed(&sluice.Evaluation{Subject: fmt.Sprint(base, seq.Add(1)), Policies: []*sluice.Policy{p}, Cost: 1}, false)
				for pb.Next() {
					if err := s.Evaluate(context.Background(), ev); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
			b.ReportMetric((redisCPU(b, c)-cpu)/float64(b.N), "redis-µs/decision")
		})
	}
}

// redisCPU returns the CPU time, user and system, the Redis server behind c
// has used, in µs: the steadiest cost figure on a shared machine.
func redisCPU(b *testing.B, c *redis.Client) float64 {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", line, err)
			}
			total += f * 1e6
		}
	}
	return total
}

// BenchmarkLease measures one lease's acquire and release through a
// Limiter on the shared standalone server, as one pair per op: serially
// and from 64 concurrent callers, each on its own subject; beside it a
// gcra decision through the same Limiter, for the ratio; then the same
// two asked of the store itself (Store.Evaluate, each caller reusing its
// evaluations, as BenchmarkEvaluate does): the store's own allocations,
// without the Limiter's (the lease id, the Lease, the Outcome).
func BenchmarkLease(b *testing.B) {
	c := standaloneClient(b)
	s := newStore(b, c, redisstore.Options{})
	l, err := sluice.New(s, []sluice.Policy{
		{ID: "lease", Algorithm: sluice.Concurrency, Limit: 100_000, LeaseTTL: time.Minute},
		{ID: "rate", Algorithm: sluice.GCRA, Limit: 1_000_000, Window: time.Second},
	}, sluice.Options{})
	if err != nil {
		b.Fatal(err)
	}
	pair := func(ctx context.Context, subj string) error {
		o := l.Check(ctx, sluice.Request{Op: sluice.Acquire, Policy: "lease", Subject: subj})
		if o.Kind != sluice.Allowed {
			return fmt.Errorf("acquire: %v %v", o.Kind, o.Err)
		}
		if o := l.Check(ctx, sluice.Request{Op: sluice.Release, Policies: o.Lease.Policies, Subject: o.Lease.Subject, LeaseID: o.Lease.ID}); o.Kind != sluice.Allowed {
			return fmt.Errorf("release: %v %v", o.Kind, o.Err)
		}
		return nil
	}
	decision := func(ctx context.Context, subj string) error {
		if o := l.Check(ctx, sluice.Request{Policy: "rate", Subject: subj}); o.Kind != sluice.Allowed {
			return fmt.Errorf("gcra: %v %v", o.Kind, o.Err)
		}
		return nil
	}
	lp, _ := l.Policy("lease")
	rp, _ := l.Policy("rate")
	// storePair and storeDecision make a caller's op on the store itself,
	// its evaluation made once; a pair's lease id is made outside the
	// store, as a Limiter makes it (here, taken from a ring of 64).
	storePair := func(subj string) func(context.Context) error {
		ev := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{&lp}}
		ids := make([]string, 64)
		for i := range ids {
			ids[i] = fmt.Sprint(subj, ".", i)
		}
		n := 0
		return func(ctx context.Context) error {
			n++
			ev.Op, ev.Cost, ev.LeaseID = sluice.Acquire, 1, ids[n%len(ids)]
			if err := s.Evaluate(ctx, formed(ev, false)); err != nil || !ev.Statuses[0].Allowed {
				return fmt.Errorf("acquire: %v %+v", err, ev.Statuses)
			}
			ev.Op, ev.Cost = sluice.Release, 0
			if err := s.Evaluate(ctx, formed(ev, false)); err != nil || !ev.Statuses[0].Allowed {
				return fmt.Errorf("release: %v %+v", err, ev.Statuses)
			}
			return nil
		}
	}
	storeDecision := func(subj string) func(context.Context) error {
		ev := formed(&sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{&rp}, Cost: 1}, false)
		return func(ctx context.Context) error {
			if err := s.Evaluate(ctx, ev); err != nil || !ev.Statuses[0].Allowed {
				return fmt.Errorf("gcra: %v %+v", err, ev.Statuses)
			}
			return nil
		}
	}
	limiterOp := func(op func(context.Context, string) error) func(string) func(context.Context) error {
		return func(subj string) func(context.Context) error {
			return func(ctx context.Context) error { return op(ctx, subj) }
		}
	}
	for _, row := range []struct {
		name string
		op   func(subj string) func(context.Context) error
	}{{"pair", limiterOp(pair)}, {"gcra", limiterOp(decision)}, {"store-pair", storePair}, {"store-gcra", storeDecision}} {
		b.Run(row.name+"/serial", func(b *testing.B) {
			op := row.op(subject(b))
			b.ReportAllocs()
			cpu := redisCPU(b, c)
			for b.Loop() {
				if err := op(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((redisCPU(b, c)-cpu)/float64(b.N), "redis-µs/op")
		})
		b.Run(row.name+"/parallel64", func(b *testing.B) {
			b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1))
			var seq atomic.Int64
			base := subject(b)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := redisCPU(b, c)
			b.RunParallel(func(pb *testing.PB) {
				op := row.op(fmt.Sprint(base, seq.Add(1)))
				for pb.Next() {
					if err := op(context.Background()); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric((redisCPU(b, c)-cpu)/float64(b.N), "redis-µs/op")
		})
	}
}
