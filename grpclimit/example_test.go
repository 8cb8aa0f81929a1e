package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
)

// A gRPC server whose health checks are limited to 5 per 10 seconds per
// client address: the sixth call is ResourceExhausted, with a
// google.rpc.RetryInfo saying when to retry and the RateLimit fields in
// its trailer.
func Example() {
	store, err := memstore.New(memstore.Options{}) // or redisstore.New(rdb, redisstore.Options{}) for a shared limit
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "health", Algorithm: sluice.SlidingLog, Limit: 5, Window: 10 * time.Second},
	}, sluice.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := grpclimit.New(limiter, grpclimit.Options{
		Methods: []grpclimit.Method{{Name: "/grpc.health.v1.Health/", Policies: []string{"health"}}},
	})
	if err != nil {
		log.Fatal(err) // an invalid option names its field, value and rule
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(limits.Unary()), grpc.ChainStreamInterceptor(limits.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Stop()

	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for i := 1; i <= 6; i++ {
		var trailer metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		fmt.Printf("call %d: %v %s\n", i, st.Code(), trailer.Get("ratelimit"))
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Printf("retry in %v\n", ri.GetRetryDelay().AsDuration().Round(time.Second))
			}
		}
	}
	// Output:
	// call 1: OK ["health";r=4;t=10]
	// call 2: OK ["health";r=3;t=10]
	// call 3: OK ["health";r=2;t=10]
	// call 4: OK ["health";r=1;t=10]
	// call 5: OK ["health";r=0;t=10]
	// call 6: ResourceExhausted ["health";r=0;t=10]
	// retry in 10s
}
