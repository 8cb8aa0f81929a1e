package memstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// An embedded store for one process. A real application leaves Clock
// unset (the monotonic clock); the fake clock here makes the output exact.
func Example() {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock, MaxKeys: 100_000})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // stops the sweeper goroutine
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "api", Algorithm: sluice.TokenBucket, Limit: 2, Window: time.Second, Burst: 4},
	}, sluice.Options{})
	if err != nil {
		log.Fatal(err)
	}
	req := sluice.Request{Policy: "api", Subject: "k1:example", Cost: 3}
	for range 3 {
		o := limiter.Check(context.Background(), req)
		fmt.Println(o.Kind, "remaining", o.Remaining, "retry after", o.RetryAfter)
		clock.Advance(500 * time.Millisecond)
	}
	fmt.Println("states held:", store.Len())
	// Output:
	// allowed remaining 1 retry after 0s
	// denied remaining 2 retry after 500ms
	// allowed remaining 0 retry after 0s
	// states held: 1
}

// A plan of 3 calls a month where the tenant lives: the quota resets at
// midnight on the 1st in Europe/Berlin (22:00 UTC in summer), and a
// denial's retry runs to that instant.
func Example_calendarPeriod() {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		log.Fatal(err)
	}
	clock := sluicetest.NewClock()
	clock.Set(time.Date(2026, 6, 30, 21, 0, 0, 0, time.UTC)) // 23:00 in Berlin
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "plan", Algorithm: sluice.FixedWindow, Limit: 3, Period: "month", TimeZone: berlin},
	}, sluice.Options{})
	if err != nil {
		log.Fatal(err)
	}
	req := sluice.Request{Policy: "plan", Subject: "k1:acme", Cost: 2}
	for range 2 {
		o := limiter.Check(context.Background(), req)
		fmt.Println(o.Kind, "remaining", o.Remaining, "retry after", o.RetryAfter, "reset after", o.ResetAfter)
	}
	clock.Advance(time.Hour) // 1 July, 00:00 in Berlin
	o := limiter.Check(context.Background(), req)
	fmt.Println(o.Kind, "remaining", o.Remaining, "reset after", o.ResetAfter)
	// Output:
	// allowed remaining 1 retry after 0s reset after 1h0m0s
	// denied remaining 1 retry after 1h0m0s reset after 1h0m0s
	// allowed remaining 1 reset after 744h0m0s
}
