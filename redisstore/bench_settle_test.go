package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// BenchmarkSettle measures an estimate and its settle, as one pair per
// op, on the store itself, serially on the shared standalone server: on
// one policy, and on two (whose estimate remembers the second's name,
// and whose settle must name it again); beside it a gcra spend with no
// id, for the ratio. redis-µs/op is the steadiest figure on a shared
// machine.
func BenchmarkSettle(b *testing.B) {
	c := standaloneClient(b)
	s := newStore(b, c, redisstore.Options{})
	first := policy(b, "tokens", sluice.GCRA, 1_000_000, time.Hour)
	second := policy(b, "daily", sluice.TokenBucket, 1_000_000, time.Hour)
	first.DedupeTTL = time.Minute
	pair := func(ps ...*sluice.Policy) func(context.Context, string, int) error {
		return func(ctx context.Context, subj string, n int) error {
			id := fmt.Sprint("call-", n)
			ev := &sluice.Evaluation{Op: sluice.Estimate, Subject: subj, Policies: ps, Cost: 5, EvaluationID: id}
			if err := s.Evaluate(ctx, ev); err != nil || !ev.Statuses[0].Allowed {
				return fmt.Errorf("estimate: %v %+v", err, ev.Statuses)
			}
			ev = &sluice.Evaluation{Op: sluice.Settle, Subject: subj, Policies: ps, Cost: 3, EvaluationID: id}
			if err := s.Evaluate(ctx, ev); err != nil || ev.Statuses[0].GivenBack != 2 {
				return fmt.Errorf("settle: %v %+v", err, ev.Statuses)
			}
			return nil
		}
	}
	for _, row := range []struct {
		name string
		op   func(context.Context, string, int) error
	}{
		{"gcra", func(ctx context.Context, subj string, _ int) error {
			ev := &sluice.Evaluation{Subject: subj, Policies: []*sluice.Policy{first}, Cost: 1}
			if err := s.Evaluate(ctx, ev); err != nil || !ev.Statuses[0].Allowed {
				return fmt.Errorf("gcra: %v %+v", err, ev.Statuses)
			}
			return nil
		}},
		{"estimate-settle-1", pair(first)},
		{"estimate-settle-2", pair(first, second)},
	} {
		b.Run(row.name, func(b *testing.B) {
			subj := subject(b)
			b.ReportAllocs()
			cpu := redisCPU(b, c)
			n := 0
			for b.Loop() {
				n++
				if err := row.op(context.Background(), subj, n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((redisCPU(b, c)-cpu)/float64(b.N), "redis-µs/op")
		})
	}
}
