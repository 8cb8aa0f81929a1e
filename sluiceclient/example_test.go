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
