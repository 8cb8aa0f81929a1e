package grpclimit_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestMethodPriority: a service's calls are sheddable unless their
// metadata say critical (PriorityFunc; in production, metadata only a
// trusted gateway sets), on one budget of 4 per hour whose sheddable
// class may use 50 %: two sheddable calls pass, the third is
// ResourceExhausted while the rest is reserved, and critical calls then
// get the other two. New refuses a class the policies do not declare.
func TestMethodPriority(t *testing.T) {
	fromMetadata := func(ctx context.Context, _ string) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-priority"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	p := sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 4, Window: time.Hour, Priorities: map[string]int{"critical": 100, "sheddable": 50}}
	ints := newInterceptors(t, sluicetest.NewClock(), grpclimit.Options{Methods: []grpclimit.Method{
		{Name: "/test.Echo/", Policies: []string{"api"}, Priority: "sheddable", PriorityFunc: fromMetadata},
	}}, p)
	s := serve(t, []grpc.UnaryServerInterceptor{ints.Unary()}, []grpc.StreamServerInterceptor{ints.Stream()})
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		_, err := s.call(t, echoUnary)
		wantCode(t, fmt.Sprint("sheddable call ", i+1), err, want)
	}
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		_, err := s.call(t, echoUnary, "x-priority", "critical")
		wantCode(t, fmt.Sprint("critical call ", i+1), err, want)
	}
	lim, err := sluice.New(sluicetestStore(t), []sluice.Policy{p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = grpclimit.New(lim, grpclimit.Options{Methods: []grpclimit.Method{{Name: "/test.Echo/", Policies: []string{"api"}, Priority: "bulk"}}})
	if err == nil || !strings.Contains(err.Error(), `Methods[0].Priority = "bulk": must be a priority class one of the policies declares`) {
		t.Errorf("New with an undeclared class = %v, want an error naming Methods[0].Priority, its value and the rule", err)
	}
}

// sluicetestStore returns a memstore on a fake clock, closed with t.
func sluicetestStore(t *testing.T) sluice.Store {
	store, err := memstore.New(memstore.Options{Clock: sluicetest.NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}
