package sluice_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestOneClock: every stage of a Limiter reads Options.Clock, the one the
// store reads too. A context's deadline is judged on it (a deadline in
// the real future that the Limiter's clock has passed sends nothing); a
// near-cache denial lasts until the store's RetryAfter on it and no
// longer, with no real time passing.
func TestOneClock(t *testing.T) {
	clock := sluicetest.NewClock()
	clock.Set(time.Now().Add(time.Hour)) // an hour ahead of the real time
	store := &countingStore{Store: newMemstore(t, clock)}
	l, err := sluice.New(store, []sluice.Policy{{ID: "login", Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Minute, NearCache: true}}, sluice.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := sluice.Request{Policy: "login", Subject: "mallory"}
	if o := l.Check(ctx, req); o.Kind != sluice.Unavailable || o.Cause != sluice.DeadlinePassed || store.calls.Load() != 0 {
		t.Fatalf("Check with a deadline the Limiter's clock has passed = %+v after %d store calls, want unavailable, deadline_passed, none", o, store.calls.Load())
	}
	bg := context.Background()
	if o := l.Check(bg, req); o.Kind != sluice.Allowed {
		t.Fatalf("first Check = %+v, want allowed", o)
	}
	denied := l.Check(bg, req)
	if denied.Kind != sluice.Denied || denied.FromCache {
		t.Fatalf("second Check = %+v, want denied by the store", denied)
	}
	calls := store.calls.Load()
	clock.Advance(denied.RetryAfter - time.Millisecond)
	if o := l.Check(bg, req); !o.FromCache || o.RetryAfter != time.Millisecond || store.calls.Load() != calls {
		t.Fatalf("Check 1ms before the retry time = %+v, want a cached denial with 1ms to wait, no store call", o)
	}
	clock.Advance(time.Millisecond)
	if o := l.Check(bg, req); o.Kind != sluice.Allowed || store.calls.Load() != calls+1 {
		t.Fatalf("Check at the retry time = %+v, want allowed by the store", o)
	}
}
