package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// A token quota for model calls: each call is spent as an estimate of 500
// tokens, run, and settled with the tokens it used.
func ExampleLimiter_Meter() {
	clock := sluicetest.NewClock()
	store, _ := memstore.New(memstore.Options{Clock: clock})
	defer store.Close()
	limiter, _ := sluice.New(store, []sluice.Policy{
		{ID: "tokens", Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Minute, DedupeTTL: time.Minute},
	}, sluice.Options{})
	for _, used := range []int64{120, 900, 10} {
		o, _ := limiter.Meter(context.Background(), sluice.Request{Policy: "tokens", Subject: "k1:team-a", Cost: 500},
			func(ctx context.Context) (int64, error) { return used, nil })
		fmt.Printf("%s charged=%d given_back=%d owed=%d remaining=%d\n", o.Kind, o.Charged, o.GivenBack, o.Owed, o.Remaining)
	}
	// Output:
	// allowed charged=0 given_back=380 owed=0 remaining=880
	// allowed charged=400 given_back=0 owed=20 remaining=0
	// denied charged=0 given_back=0 owed=0 remaining=0
}

// TestMeter: work runs only when the estimate is admitted; a panic or a
// cancelled context still settles (at the estimate, for a panic); the
// error of work is returned beside the settle's outcome.
func TestMeter(t *testing.T) {
	clock := sluicetest.NewClock()
	store, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	lim, err := sluice.New(store, []sluice.Policy{{ID: "p", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute, DedupeTTL: time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	req := sluice.Request{Policy: "p", Subject: "k1:a", Cost: 4}
	boom := errors.New("boom")
	ctx, cancel := context.WithCancel(context.Background())
	o, err := lim.Meter(ctx, req, func(context.Context) (int64, error) { cancel(); return 1, boom })
	if !errors.Is(err, boom) || o.Kind != sluice.Allowed || o.GivenBack != 3 || o.Remaining != 9 {
		t.Fatalf("Meter(estimate 4, used 1, context cancelled) = %+v, %v; want allowed, 3 given back, 9 left, boom", o, err)
	}
	func() {
		defer func() {
			if r := recover(); r != "panic" {
				t.Fatalf("Meter's work panicked: recovered %v, want the panic re-raised", r)
			}
		}()
		lim.Meter(context.Background(), req, func(context.Context) (int64, error) { panic("panic") })
	}()
	if o := lim.Check(context.Background(), sluice.Request{Op: sluice.Peek, Policy: "p", Subject: "k1:a"}); o.Remaining != 5 {
		t.Fatalf("after a panicking work settled at its estimate of 4, peek = %+v, want 5 left", o)
	}
	ran := false
	o, err = lim.Meter(context.Background(), sluice.Request{Policy: "p", Subject: "k1:a", Cost: 6}, func(context.Context) (int64, error) { ran = true; return 0, nil })
	if ran || err != nil || o.Kind != sluice.Denied {
		t.Fatalf("Meter(estimate 6, 5 left) = %+v, %v, ran %v; want denied, work not run", o, err, ran)
	}
	if o, _ := lim.Meter(context.Background(), sluice.Request{Op: sluice.Refund, Policy: "p", Subject: "k1:a"}, nil); o.Kind != sluice.Incompatible {
		t.Fatalf("Meter(refund) = %+v, want incompatible", o)
	}
}
