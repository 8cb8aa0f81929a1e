package sluice_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/sluicetest"
)

// formStore records the form of each Evaluation it is handed, as a store
// reads it (evaluation.Short), and answers through memstore.
type formStore struct {
	sluice.Store
	short []bool
}

func (f *formStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	f.short = append(f.short, evaluation.Short(ev))
	return f.Store.Evaluate(ctx, ev)
}

// TestShortForm: the Limiter's validation records the form on the
// Evaluation, once, and every store reads it there: the short form for
// one policy's spend or peek (a class, a local-quota held spend and an
// override included) or one concurrency policy's acquire or release; the
// general form for anything with an evaluation id, older subjects, a
// book, several policies or another operation.
func TestShortForm(t *testing.T) {
	clock := sluicetest.NewClock()
	policies := []sluice.Policy{
		{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Second, Priorities: map[string]int{"sheddable": 50}},
		{ID: "gcra", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 10, MaxWait: time.Second},
		{ID: "lq", Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Second, LocalQuota: sluice.LocalQuota{Enabled: true}},
		{ID: "conc", Algorithm: sluice.Concurrency, Limit: 5, LeaseTTL: time.Minute},
	}
	fs := &formStore{Store: newMemstore(t, clock)}
	l, err := sluice.New(fs, policies, sluice.Options{Clock: clock, Overrides: []sluice.Override{{Policy: "gcra", Subject: "vip", Limit: 200, Burst: 20}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req   sluice.Request
		short bool
	}{
		{sluice.Request{Policy: "fw", Subject: "a"}, true},
		{sluice.Request{Policy: "fw", Subject: "a", Cost: 3, Priority: "sheddable"}, true},
		{sluice.Request{Op: sluice.Peek, Policy: "gcra", Subject: "a"}, true},
		{sluice.Request{Policy: "gcra", Subject: "vip"}, true},
		{sluice.Request{Policy: "lq", Subject: "a"}, true},
		{sluice.Request{Op: sluice.Acquire, Policy: "conc", Subject: "a", LeaseID: "l1"}, true},
		{sluice.Request{Op: sluice.Release, Policy: "conc", Subject: "a", LeaseID: "l1"}, true},
		{sluice.Request{Policy: "fw", Subject: "a", EvaluationID: "e1"}, false},
		{sluice.Request{Op: sluice.Peek, Policy: "fw", Subject: "a", EvaluationID: "e1"}, false},
		{sluice.Request{Policy: "fw", Subject: "a", Previous: []string{"b"}}, false},
		{sluice.Request{Policies: []string{"fw", "gcra"}, Subject: "a"}, false},
		{sluice.Request{Op: sluice.Book, Policy: "gcra", Subject: "a"}, false},
		{sluice.Request{Op: sluice.Refund, Policy: "fw", Subject: "a"}, false},
		{sluice.Request{Op: sluice.Reset, Policy: "fw", Subject: "a"}, false},
		{sluice.Request{Op: sluice.Renew, Policy: "conc", Subject: "a", LeaseID: "l1"}, false},
		{sluice.Request{Op: sluice.Acquire, Policies: []string{"conc", "fw"}, Subject: "a"}, false},
	} {
		fs.short = fs.short[:0]
		o := l.Check(context.Background(), c.req)
		if o.Err != nil || len(fs.short) != 1 {
			t.Fatalf("Check(%+v) = %+v, the store handed %d evaluations", c.req, o, len(fs.short))
		}
		if fs.short[0] != c.short {
			t.Errorf("Check(%+v): the store read short = %v, want %v", c.req, fs.short[0], c.short)
		}
	}
}
