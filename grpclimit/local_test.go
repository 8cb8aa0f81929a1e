package grpclimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
)

// downStore is a Store that cannot decide: its server is unreachable.
type downStore struct{}

func (downStore) Evaluate(context.Context, *sluice.Evaluation) error {
	return fmt.Errorf("test: dial: %w", sluice.FailedBeforeSend)
}

// TestLocalFallback: while the store cannot decide, a method failing
// local is decided by the local fallback, holding LocalShare of the limit
// (0.5 of 4: two calls), and one failing closed is refused Unavailable.
func TestLocalFallback(t *testing.T) {
	local, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Close() })
	ints := newOn(t, downStore{}, grpclimit.Options{
		Methods: []grpclimit.Method{
			{Name: echoUnary, Policies: []string{"api"}, FailureMode: failure.Local},
			{Name: otherUnary, Policies: []string{"api"}},
		},
		Fallback:   local,
		LocalShare: 0.5,
	}, slidingLog("api", 4, time.Minute))
	s := serveInterceptors(t, ints)
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		_, err := s.call(t, echoUnary)
		wantCode(t, fmt.Sprintf("local call %d", i+1), err, want)
	}
	_, err = s.call(t, otherUnary)
	wantCode(t, "closed call", err, codes.Unavailable)
}
