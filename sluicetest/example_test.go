package sluicetest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// A store of your own passes the behavioural suite that memstore and
// redisstore pass: call TestStore from a test of your package, e.g.
//
//	func TestMyStore(t *testing.T) { sluicetest.TestStore(t, newMyStore) }
//
// with a function like this one, which builds a store reading the
// suite's fake clock.
func ExampleTestStore() {
	newStore := func(t *testing.T, clock sluice.Clock) sluice.Store {
		s, err := memstore.New(memstore.Options{Clock: clock}) // your store here
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	_ = func(t *testing.T) { sluicetest.TestStore(t, newStore) }
}

// The fake clock moves only when told, so a test of a limit is exact and
// never sleeps.
func ExampleClock() {
	clock := sluicetest.NewClock()
	start := clock.Now()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "login", Algorithm: sluice.SlidingLog, Limit: 2, Window: time.Minute},
	}, sluice.Options{})
	if err != nil {
		panic(err)
	}
	for _, step := range []time.Duration{0, 10 * time.Second, 20 * time.Second, 30 * time.Second} {
		clock.Advance(step)
		o := limiter.Check(context.Background(), sluice.Request{Policy: "login", Subject: "k1:user"})
		fmt.Printf("t=%v %s retry_after=%v\n", clock.Now().Sub(start), o.Kind, o.RetryAfter)
	}
	// Output:
	// t=0s allowed retry_after=0s
	// t=10s allowed retry_after=0s
	// t=30s denied retry_after=30s
	// t=1m0s allowed retry_after=0s
}
