//go:build unix

package rlqs

import (
	"context"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// BenchmarkRLQSJoin: a stream joining a settled fleet, as the last of
// 1 000 streams × 100 buckets: its first report of the fleet's 100
// buckets, answered (the claim of a floor each, at once), then its end,
// waited for (the server has freed its shares) before the next. Client
// and server in one process: ns/op, allocs/op and cpu-ns/op are both's.
func BenchmarkRLQSJoin(b *testing.B) {
	f := fleetShape{999, 100}
	left := make(chan struct{}, 1)
	svc, addr, stop, err := startBenchService("edge", Options{left: func() {
		select {
		case left <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	fl := mustFleet(b, addr, "edge", f, func() error { svc.round(context.Background()); return nil })
	b.Cleanup(fl.close)
	b.ReportAllocs()
	cpu0 := cpuTime()
	i := 0
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := rlqspb.NewRateLimitQuotaServiceClient(fl.conns[i%len(fl.conns)]).StreamRateLimitQuotas(ctx)
		if err != nil {
			b.Fatal(err)
		}
		st := &benchStream{s: s, got: make(chan struct{}, 1), done: make(chan struct{})}
		go st.read()
		if err := st.report(fl.first, int64(f.buckets), time.After(time.Minute)); err != nil {
			b.Fatal(err)
		}
		cancel()
		<-st.done
		select {
		case <-left:
		case <-time.After(time.Minute):
			b.Fatal("the stream did not leave")
		}
		i++
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}
