package rls

import "google.golang.org/grpc"

// streamWorkers is how many goroutines the gRPC server keeps to run
// calls on (ServerOptions).
const streamWorkers = 64

// ServerOptions are the options of the gRPC server the Service is
// registered on: calls run on streamWorkers long-lived goroutines (a call
// finding them all busy gets one of its own, as without the option)
// instead of a goroutine each, whose stack grew by copying on every call
// through the Limiter and the store: 12 % of the CPU of
// BenchmarkShouldRateLimit.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(streamWorkers)}
}
