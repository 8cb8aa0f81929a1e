package rls_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/subject"
)

// BenchmarkShouldRateLimit measures ShouldRateLimit over a real gRPC
// connection on a real Redis, one descriptor user=<one of 10 000> per
// request under a fixed window of a second, as bench/rls.go drives sluice
// serve beside envoyproxy/ratelimit. Its CPU profile says where the
// service's time goes:
//
//	go test -run '^$' -bench ShouldRateLimit -cpuprofile cpu.out ./internal/envoy/rls
//	go tool pprof -top -cum -focus 'rls.\(\*Service\)' cpu.out
func BenchmarkShouldRateLimit(b *testing.B) {
	srv := redistest.Standalone(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 20})
	defer c.Close()
	store, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := rules.Parse([]rules.Source{{Name: "bench.yaml", Data: []byte("domain: bench\ndescriptors:\n  - key: user\n    rate_limit: { unit: second, requests_per_unit: 1000000 }\n")}})
	if err != nil {
		b.Fatal(err)
	}
	lim, err := sluice.New(store, cfg.Policies(), sluice.Options{})
	if err != nil {
		b.Fatal(err)
	}
	m, err := rls.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	core, err := edge.New(lim, edge.Options{Logger: log, Prefix: "envoy"})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := rls.New(&rls.State{Rules: cfg, Limiter: lim, Store: store, Pseudonymizer: subject.Unkeyed(), Core: core}, rls.Options{Logger: log, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(rls.ServerOptions()...) // as sluice serve's
	svc.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	defer func() { g.Stop(); <-done }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := rlspb.NewRateLimitServiceClient(conn)
	const subjects = 10_000
	reqs := make([]*rlspb.RateLimitRequest, subjects)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*commonpb.RateLimitDescriptor{
			{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user", Value: "user-" + strconv.Itoa(i)}}},
		}}
	}
	b.ReportAllocs()
	b.SetParallelism(32) // 64 callers on 2 cores, as the bench module's row
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			resp, err := client.ShouldRateLimit(context.Background(), reqs[i%subjects])
			if err != nil {
				b.Error(err)
				return
			}
			if resp.OverallCode != rlspb.RateLimitResponse_OK {
				b.Errorf("ShouldRateLimit: %v", resp.OverallCode)
				return
			}
			i += 7
		}
	})
}
