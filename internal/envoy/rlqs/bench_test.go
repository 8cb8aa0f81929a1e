//go:build unix

package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// What one server carries (BENCHMARKS.md, "Envoy's quota service
// (RLQS)"): the CPU of a report and of a split round with a fleet of
// streams × buckets held. They run only with -bench (make test runs no
// benchmark); each sets its fleet up once, then measures the steady state:
// every stream reports every bucket with the same demand, so rounds
// change no share and push nothing (pushed/op says so).

// BenchmarkRLQSReport: one stream's report of all its buckets, answered
// (an action a bucket), 64 reports in flight over the fleet's streams in
// turn, no round meanwhile. in-process: client and server in this
// process, so ns/op, allocs/op and cpu-ns/op (getrusage around the run)
// are both's. server-process: the server is this test binary run again
// (serveBenchChild), so server-cpu-ns/op (its getrusage) and
// server-allocs/op (its MemStats) around the run are the server's alone,
// and ns/op, allocs/op and cpu-ns/op the client's; server-heap-MiB is its
// heap in use with the fleet held.
func BenchmarkRLQSReport(b *testing.B) {
	for _, f := range benchShapes {
		// RunParallel calls a benchmark several times: the fleet is set up
		// once, on the first call, and ended when the run is over.
		var fl *benchFleet
		var stop func()
		b.Run("in-process/"+f.String(), func(b *testing.B) {
			if fl == nil {
				svc, addr, stopSvc, err := startBenchService("edge", Options{})
				if err != nil {
					b.Fatal(err)
				}
				stop = stopSvc
				fl = mustFleet(b, addr, "edge", f, func() error { svc.round(context.Background()); return nil })
			}
			runReports(b, fl)
		})
		endFleet(fl, stop)
		fl, stop = nil, nil
		var c *childServer
		b.Run("server-process/"+f.String(), func(b *testing.B) {
			if fl == nil {
				var err error
				if c, err = startChild(); err != nil {
					b.Fatal(err)
				}
				stop = c.stop
				fl = mustFleet(b, c.addr, "edge", f, func() error { _, err := c.ask("round"); return err })
			}
			s0, err := c.stats()
			if err != nil {
				b.Fatal(err)
			}
			runReports(b, fl)
			s1, err := c.stats()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(s1.cpu-s0.cpu)/float64(b.N), "server-cpu-ns/op")
			b.ReportMetric(float64(s1.mallocs-s0.mallocs)/float64(b.N), "server-allocs/op")
			b.ReportMetric(float64(s1.heap)/(1<<20), "server-heap-MiB")
		})
		endFleet(fl, stop)
	}
}

func mustFleet(b *testing.B, addr, domain string, f fleetShape, round func() error) *benchFleet {
	b.Helper()
	fl, err := dialFleet(addr, domain, f)
	if err != nil {
		b.Fatal(err)
	}
	if err := fl.settle(round); err != nil {
		fl.close()
		b.Fatal(err)
	}
	return fl
}

func endFleet(fl *benchFleet, stop func()) {
	if fl != nil {
		fl.close()
	}
	if stop != nil {
		stop()
	}
}

// runReports measures reports on fl: 32 goroutines a core, each on its
// own streams in turn, one report in flight a stream.
func runReports(b *testing.B, fl *benchFleet) {
	const perCore = 32
	g := perCore * runtime.GOMAXPROCS(0)
	var id atomic.Int64
	want := int64(fl.shape.buckets)
	b.ReportAllocs()
	b.SetParallelism(perCore)
	cpu0 := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		me := int(id.Add(1) - 1)
		i := me
		for pb.Next() {
			if err := fl.streams[i].report(fl.steady, want, nil); err != nil {
				b.Error(err)
				return
			}
			if i += g; i >= len(fl.streams) {
				i = me
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// benchRedisEnv, when set to host:port, points BenchmarkRLQSRound's
// redis runs at that server instead of one they start: a server under
// callgrind (../shared/tools/rediscg), to count its instructions per
// round.
const benchRedisEnv = "SLUICE_RLQS_BENCH_REDIS"

// BenchmarkRLQSRound: one split round of the domain (the unexported
// round, as the ticker runs it) with the fleet's streams × buckets held,
// on the Memory ledger and on the Redis ledger (a real redis-server).
// ledger-calls/op is the round's store calls; cpu-ns/op this process's
// CPU a round (getrusage); redis-cpu-ns/op redis-server's (INFO cpu).
func BenchmarkRLQSRound(b *testing.B) {
	for _, store := range []string{"memory", "redis"} {
		for _, f := range benchShapes {
			b.Run(store+"/"+f.String(), func(b *testing.B) { benchRound(b, store, f) })
		}
	}
}

// countedLedger counts its claims (store calls).
type countedLedger struct {
	ledger.Ledger
	calls atomic.Int64
}

func (l *countedLedger) Claim(ctx context.Context, domain, instance string, cs []ledger.Claim, ttl time.Duration) ([]ledger.Grant, error) {
	l.calls.Add(1)
	return l.Ledger.Claim(ctx, domain, instance, cs, ttl)
}

func benchRound(b *testing.B, store string, f fleetShape) {
	ctx := context.Background()
	domain := fmt.Sprintf("bench-%d", rand.Uint64())
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	l := &countedLedger{Ledger: ledger.NewMemory(clk.Now)}
	var rc *redis.Client
	if store == "redis" {
		rc = benchRedis(b)
		r, err := ledger.NewRedis(rc, "")
		if err != nil {
			b.Fatal(err)
		}
		l.Ledger = r
	}
	svc, addr, stop, err := startBenchService(domain, Options{Ledger: l, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	fl := mustFleet(b, addr, domain, f, func() error { svc.round(ctx); return nil })
	b.Cleanup(fl.close)
	b.Cleanup(func() { _ = l.Release(ctx, domain, svc.instance) })
	b.ReportAllocs()
	calls0, pushed0, cpu0, redis0 := l.calls.Load(), fl.received(), cpuTime(), redisCPU(b, rc)
	for b.Loop() {
		svc.round(ctx)
	}
	n := float64(b.N)
	b.ReportMetric(float64(cpuTime()-cpu0)/n, "cpu-ns/op")
	b.ReportMetric(float64(l.calls.Load()-calls0)/n, "ledger-calls/op")
	b.ReportMetric(float64(fl.received()-pushed0)/n, "pushed/op")
	if rc != nil {
		b.ReportMetric(float64(redisCPU(b, rc)-redis0)/n, "redis-cpu-ns/op")
	}
}

// benchRedis is a client of the server benchRedisEnv names, else of a
// redis-server started for b.
func benchRedis(b *testing.B) *redis.Client {
	var c *redis.Client
	if addr := os.Getenv(benchRedisEnv); addr != "" {
		c = redis.NewClient(&redis.Options{Addr: addr})
	} else {
		c = redistest.Standalone(b).Client()
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// redisCPU is the CPU time redis-server has used, user and system (INFO
// cpu); 0 without a client.
func redisCPU(b *testing.B, c *redis.Client) time.Duration {
	if c == nil {
		return 0
	}
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			s, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += time.Duration(s * float64(time.Second))
		}
	}
	return total
}
