package rlqs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// bigReport is a report naming n buckets no matcher matches, each id
// with a value of 200 bytes: its answer (n ALLOW_ALL actions echoing the
// ids) is about n × 220 bytes.
func bigReport(domain string, n, round int) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: domain}
	pad := strings.Repeat("v", 190)
	for i := range n {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:    &rlqspb.BucketId{Bucket: map[string]string{"unmatched": fmt.Sprintf("%s-%d-%04d", pad, round, i)}},
			TimeElapsed: durationpb.New(time.Second)})
	}
	return m
}

// TestSlowStreamIsEnded: a client that never reads. Its stream's flow
// control window is 64 KiB (set, so gRPC does not grow it) and the
// server's write quota 64 KiB: the first answer of ~220 KB is queued, the
// second Send blocks for good. A round more than a round after that send
// began ends the stream (ResourceExhausted), and the handler returns
// though its writer is still blocked in Send: returning is what unblocks
// it (gRPC then ends the stream).
func TestSlowStreamIsEnded(t *testing.T) {
	sends := make(chan struct{}, 16)
	h := newHarness(t, testConfig(), Options{sending: func() { sends <- struct{}{} }})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := s.Send(bigReport("edge", 1000, i)); err != nil {
			t.Fatal(err)
		}
		<-sends // the writer began sending the answer: the second never completes
	}
	h.clock.advance(2 * time.Second)
	h.round()
	<-h.left // the handler returned, its stream's shares freed
	for {
		if _, err = s.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too slow") {
		t.Fatalf("the slow stream ended with %v, want ResourceExhausted naming it too slow", err)
	}
}
