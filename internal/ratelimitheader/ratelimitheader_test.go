package ratelimitheader_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
	"github.com/sluicehq/sluice/internal/sfparse"
)

func TestAppendPolicyItem(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    sluice.Policy
		want string
	}{
		{"whole seconds", sluice.Policy{ID: "demo", Limit: 3, Window: 10 * time.Second}, `"demo";q=3;w=10`},
		{"an hour", sluice.Policy{ID: "hourly", Limit: 5, Window: time.Hour}, `"hourly";q=5;w=3600`},
		// The draft's w is an optional Integer: a window that is not a
		// whole number of seconds leaves it out rather than misstate it.
		{"sub-second", sluice.Policy{ID: "tiny", Limit: 1, Window: 1500 * time.Microsecond}, `"tiny";q=1`},
		{"fractional seconds", sluice.Policy{ID: "slow", Limit: 1, Window: 2500 * time.Millisecond}, `"slow";q=1`},
	} {
		got := string(ratelimitheader.AppendPolicyItem(nil, tt.p))
		if got != tt.want {
			t.Errorf("%s: AppendPolicyItem(%+v) = %s, want %s", tt.name, tt.p, got, tt.want)
		}
		if _, err := sfparse.ParseList(got); err != nil {
			t.Errorf("%s: %s is not an RFC 9651 list: %v", tt.name, got, err)
		}
	}
}

func TestAppendLimitField(t *testing.T) {
	login := sluice.Status{Policy: "login", Allowed: true, Limit: 5, Remaining: 2, ResetAfter: time.Minute}
	demo := sluice.Status{Policy: "demo", Limit: 3, ResetAfter: 7500 * time.Millisecond, RetryAfter: 7500 * time.Millisecond}
	for _, tt := range []struct {
		name string
		o    sluice.Outcome
		want string
	}{
		{"one policy", sluice.Outcome{Kind: sluice.Allowed, Status: login}, `"login";r=2;t=60`},
		{"most restrictive first", sluice.Outcome{Kind: sluice.Denied, Status: demo, Statuses: []sluice.Status{login, demo}}, `"demo";r=0;t=8, "login";r=2;t=60`},
		{"negative remaining is 0", sluice.Outcome{Kind: sluice.Denied, Status: sluice.Status{Policy: "x", Remaining: -1}}, `"x";r=0;t=0`},
	} {
		if got := string(ratelimitheader.AppendLimitField(nil, tt.o)); got != tt.want {
			t.Errorf("%s: AppendLimitField = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second: 1, 0: 1, time.Microsecond: 1, time.Second: 1,
		time.Second + time.Microsecond: 2, 7500 * time.Millisecond: 8,
	} {
		if got := ratelimitheader.RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}
