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
