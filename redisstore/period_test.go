package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/redisstore"
)

// monthly returns a fixed_window policy of limit per month in UTC.
func monthly(t *testing.T, limit int64) *sluice.Policy {
	t.Helper()
	p := sluice.Policy{ID: "monthly", Algorithm: sluice.FixedWindow, Limit: limit, Period: "month"}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	p = evaluation.Defaults(p)
	return &p
}

// TestPeriodRecordBounds: the script holds a calendar period's record
// (end, count, newest write) to FixedPeriod.corrupt at its edges: a
// newest write 367 days before the end is read, one µs more is corrupt;
// and it holds the bounds a caller sends to Params.checkBounds: a
// period's end below 2^53 is taken, at 2^53 it is refused as an invalid
// request, before anything is read.
func TestPeriodRecordBounds(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	p := monthly(t, 10)
	now := time.Now().UnixMicro()
	day := int64(86_400_000_000)
	// Periods of 367 days ending after now.
	b := [4]int64{now - 2*day, now - day, now + algorithm.MaxPeriod - day, now + 2*algorithm.MaxPeriod - day}
	s := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{}), Bounds: func(*sluice.Policy) [4]int64 { return b }}
	for _, c0 := range []struct {
		name      string
		end, last int64
		want      string
	}{
		{"a write 367 days before its end", b[2], b[2] - algorithm.MaxPeriod, ""},
		{"a write 367 days and 1µs before its end", b[2], b[2] - algorithm.MaxPeriod - 1, "want 0 < last < end <= last + 367 days"},
		{"a write at its end", b[2], b[2], "want 0 < last < end"},
	} {
		subj := subject(t)
		if err := setBinary(c, float64(c0.end), 3, float64(c0.last))(s.Key(subj, p)); err != nil {
			t.Fatal(err)
		}
		st, err := evaluate(ctx, s, subj, 1, p)
		switch {
		case c0.want == "" && (err != nil || !st[0].Allowed || st[0].Remaining != 6):
			t.Errorf("%s: Evaluate = %+v, %v; want admitted, 6 left of the 3 spent", c0.name, st, err)
		case c0.want != "" && (!errors.Is(err, sluice.CorruptState) || !strings.Contains(err.Error(), c0.want)):
			t.Errorf("%s: Evaluate = %+v, %v; want CorruptState saying %q", c0.name, st, err, c0.want)
		}
	}
	b = [4]int64{algorithm.MaxExact - 4*day, algorithm.MaxExact - 3*day, algorithm.MaxExact - 2*day, algorithm.MaxExact}
	if _, err := evaluate(ctx, s, subject(t), 1, p); !errors.Is(err, sluice.ErrInvalidRequest) || !strings.Contains(err.Error(), "below 2^53") {
		t.Errorf("bounds ending at 2^53: Evaluate = %v, want an invalid request naming 2^53", err)
	}
	b = [4]int64{now - 2*day, now - day, now + algorithm.MaxPeriod, now + 2*algorithm.MaxPeriod}
	if _, err := evaluate(ctx, s, subject(t), 1, p); !errors.Is(err, sluice.ErrInvalidRequest) || !strings.Contains(err.Error(), "367 days") {
		t.Errorf("a period of 367 days and 1µs: Evaluate = %v, want an invalid request naming 367 days", err)
	}
}

// TestPeriodKeyExpiresAtItsEnd: on Redis time a period's key expires at
// the period's end (plus the grace: none here), and the decision's reset
// runs to that end as Redis's clock reads it.
func TestPeriodKeyExpiresAtItsEnd(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	var at int64
	now := redisNow(t, c)
	b := [4]int64{now - 20_000_000, now - 10_000_000, now + 10_000_000, now + 30_000_000}
	s := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{}), Bounds: func(*sluice.Policy) [4]int64 { return b }, OnRedisTime: func(now int64) { at = now }}
	p := monthly(t, 10)
	subj := subject(t)
	st := mustEvaluate(t, s, subj, 4, p)
	if !st[0].Allowed || st[0].Remaining != 6 || st[0].ResetAfter != time.Duration(b[2]-at)*time.Microsecond {
		t.Fatalf("Evaluate = %+v at %d, want admitted, 6 left, reset at %d", st[0], at, b[2])
	}
	ttl, err := c.PTTL(ctx, s.Key(subj, p)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if most := time.Duration(b[2]-at+999) * time.Microsecond; ttl <= 0 || ttl > most {
		t.Errorf("PTTL = %v, want until the period's end, at most %v", ttl, most)
	}
}

// TestPeriodOnRedisTimeWithTheSystemCalendar: on Redis time, without a
// test's bounds, the store sends the calendar's minutes around this
// process's clock and the script counts in the minute holding Redis's
// clock: the reset runs to that minute's end, as the time the script
// answers with reads it.
func TestPeriodOnRedisTimeWithTheSystemCalendar(t *testing.T) {
	c := standaloneClient(t)
	var at int64
	s := &redisstore.Driven{Store: newStore(t, c, redisstore.Options{}), OnRedisTime: func(now int64) { at = now }}
	p := sluice.Policy{ID: "perminute", Algorithm: sluice.FixedWindow, Limit: 5, Period: "minute"}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	p = evaluation.Defaults(p)
	subj := subject(t)
	for i := range 3 {
		st := mustEvaluate(t, s, subj, 1, &p)
		end := (at/60_000_000 + 1) * 60_000_000
		if !st[0].Allowed || st[0].ResetAfter != time.Duration(end-at)*time.Microsecond {
			t.Fatalf("spend %d at %d (Redis time) = %+v, want admitted, reset at the minute's end %d", i, at, st[0], end)
		}
	}
}
