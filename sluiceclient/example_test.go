package sluiceclient_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluiceclient"
)

// Four checks for one subject against a server's policy "demo" of 3 per
// hour.
func Example() {
	url, stop := runningServer() // e.g. "https://sluice.internal:8080"
	defer stop()

	client, err := sluiceclient.New(url, sluiceclient.Options{
		Token: "app-secret-0123456789", // in production: os.Getenv("SLUICE_TOKEN")
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	for range 4 {
		o := client.Check(context.Background(), sluice.Request{Policy: "demo", Subject: "alice@example.com"})
		switch o.Kind {
		case sluice.Allowed:
			fmt.Println("allowed, remaining", o.Remaining)
		case sluice.Denied:
			fmt.Println("denied, retry in", o.RetryAfter.Round(time.Minute))
		default: // unavailable, indeterminate, incompatible: no decision
			fmt.Println(o.Kind, o.Err)
		}
	}
	// Output:
	// allowed, remaining 2
	// allowed, remaining 1
	// allowed, remaining 0
	// denied, retry in 1h0m0s
}

// Every operation of a sluice.Request goes through Check: here a peek, a
// refund and a reset, which unlocks a subject that spent its budget.
func ExampleClient_Check() {
	client, stop := clientOfRunningServer() // as in the package example
	defer stop()
	ctx := context.Background()
	client.Check(ctx, sluice.Request{Policy: "demo", Subject: "bob", Cost: 3})
	o := client.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: "demo", Subject: "bob"})
	fmt.Println("peek:", o.Kind, o.Remaining)
	o = client.Check(ctx, sluice.Request{Op: sluice.Refund, Policy: "demo", Subject: "bob", Cost: 2})
	fmt.Println("refund of 2:", o.Kind, o.Remaining)
	o = client.Check(ctx, sluice.Request{Op: sluice.Reset, Policy: "demo", Subject: "bob"})
	fmt.Println("reset:", o.Kind, o.Remaining)
	// Output:
	// peek: denied 0
	// refund of 2: allowed 2
	// reset: allowed 3
}

// A check of a concurrency policy holds a lease while the work runs;
// Release gives it back (a Check of sluice.Release with the lease's ID
// does the same), Renew keeps it past its lease_ttl.
func ExampleClient_Release() {
	client, stop := clientOfRunningServer() // as in the package example
	defer stop()
	ctx := context.Background()
	o := client.Check(ctx, sluice.Request{Policy: "reports", Subject: "carol"})
	if o.Kind != sluice.Allowed {
		fmt.Println("no slot:", o.Kind, o.Err)
		return
	}
	fmt.Println("slots free while working:", o.Remaining)
	client.Renew(ctx, o.Lease) // a long report: another lease_ttl
	o = client.Release(context.WithoutCancel(ctx), o.Lease)
	fmt.Println("slots free after release:", o.Remaining)
	// Output:
	// slots free while working: 1
	// slots free after release: 2
}
