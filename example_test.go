package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/subject"
)

// Three requests per ten seconds per account: the fourth is denied until
// the window ends. A real application leaves memstore's Clock unset (it
// then reads a monotonic clock); the fake clock here makes the output
// exact.
func Example() {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
	}, sluice.Options{})
	if err != nil {
		panic(err)
	}
	account := subject.Unkeyed().Pseudonym("principal", "alice@example.com", "demo")
	for i := 0; i < 4; i++ {
		o := limiter.Check(context.Background(), sluice.Request{Policy: "demo", Subject: account})
		fmt.Printf("%s remaining=%d retry_after=%v\n", o.Kind, o.Remaining, o.RetryAfter)
		clock.Advance(time.Second)
	}
	// Output:
	// allowed remaining=2 retry_after=0s
	// allowed remaining=1 retry_after=0s
	// allowed remaining=0 retry_after=0s
	// denied remaining=0 retry_after=7s
}

// Several policies are checked at once, all or nothing: a burst limit and
// an hourly quota.
func ExampleLimiter_Check_multiplePolicies() {
	clock := sluicetest.NewClock()
	store, _ := memstore.New(memstore.Options{Clock: clock})
	defer store.Close()
	limiter, _ := sluice.New(store, []sluice.Policy{
		{ID: "per-second", Algorithm: sluice.GCRA, Limit: 10, Window: time.Second, Burst: 5},
		{ID: "per-hour", Algorithm: sluice.SlidingWindow, Limit: 6, Window: time.Hour},
	}, sluice.Options{})
	req := sluice.Request{Policies: []string{"per-second", "per-hour"}, Subject: "k1:example", Cost: 5}
	o := limiter.Check(context.Background(), req)
	fmt.Println(o.Kind, o.Policy, o.Remaining)
	o = limiter.Check(context.Background(), req)
	fmt.Println(o.Kind, o.Policy, o.Statuses[0].Allowed, o.Statuses[1].Allowed)
	// Output:
	// allowed per-second 0
	// denied per-hour false false
}

// At most two reports at once per account, and ten a minute: an allowed
// check holds a lease until it is released (or until its lease_ttl
// passes, should the holder die).
func ExampleLimiter_Check_concurrency() {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "reports", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: 30 * time.Second},
		{ID: "reports-rate", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
	}, sluice.Options{})
	if err != nil {
		panic(err)
	}
	account := subject.Unkeyed().Pseudonym("principal", "alice@example.com", "reports")
	req := sluice.Request{Op: sluice.Acquire, Policies: []string{"reports-rate", "reports"}, Subject: account}
	ctx := context.Background()

	first := limiter.Check(ctx, req)
	second := limiter.Check(ctx, req)
	third := limiter.Check(ctx, req)
	fmt.Println(first.Kind, second.Kind, third.Kind, "retry after", third.RetryAfter, "by", third.Policy)

	lease := first.Lease // usually: defer limiter.Check(context.WithoutCancel(ctx), …) of the same Release
	limiter.Check(ctx, sluice.Request{Op: sluice.Release, Policies: lease.Policies, Subject: lease.Subject, LeaseID: lease.ID})
	fmt.Println("after a release:", limiter.Check(ctx, req).Kind)

	clock.Advance(30 * time.Second) // the other holders never released: their leases expire
	o := limiter.Check(ctx, req)
	fmt.Println("30s later:", o.Kind, "remaining", o.Statuses[1].Remaining)
	// Output:
	// allowed allowed denied retry after 30s by reports
	// after a release: allowed
	// 30s later: allowed remaining 1
}

// A tenant on a plan of its own: raised from 10 to 100 per minute after
// spending 8, it keeps what it spent (92 left); removing the override
// gives it the policy's numbers back, still with its 9 spent.
func ExampleLimiter_SetOverride() {
	store, err := memstore.New(memstore.Options{Clock: sluicetest.NewClock()})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "api", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
	}, sluice.Options{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	tenant := subject.Unkeyed().Pseudonym("principal", "acme", "api")
	limiter.Check(ctx, sluice.Request{Policy: "api", Subject: tenant, Cost: 8})
	if err := limiter.SetOverride(ctx, sluice.Override{Policy: "api", Subject: tenant, Limit: 100, Note: "acme: enterprise plan"}); err != nil {
		panic(err)
	}
	o := limiter.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: "api", Subject: tenant})
	fmt.Printf("raised: %d of %d left\n", o.Remaining, o.Limit)
	limiter.Check(ctx, sluice.Request{Policy: "api", Subject: tenant})
	if err := limiter.SetOverride(ctx, sluice.Override{Policy: "api", Subject: tenant}); err != nil {
		panic(err)
	}
	o = limiter.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: "api", Subject: tenant})
	fmt.Printf("removed: %d of %d left\n", o.Remaining, o.Limit)
	// Output:
	// raised: 92 of 100 left
	// removed: 1 of 10 left
}

// Three workers reserve a turn on one upstream's 200 per second at the
// same instant (x/time/rate's Reserve, on a budget every process on the
// store shares): the first goes now, each next one slot later. Wait is
// the same that also sleeps until the slot.
func ExampleLimiter_Reserve() {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "upstream", Algorithm: sluice.GCRA, Limit: 200, Window: time.Second, Burst: 1},
	}, sluice.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	for range 3 {
		// The second result, cancel, gives the slot back while it is ahead.
		o, _ := limiter.Reserve(context.Background(), sluice.Request{Policy: "upstream", Subject: "payments-api"})
		fmt.Println(o.Kind, o.Delay)
	}
	// Output:
	// allowed 0s
	// allowed 5ms
	// allowed 10ms
}
