package sluice_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/policyerr"
)

func TestPolicyValidate(t *testing.T) {
	base := sluice.Policy{ID: "api", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Second}
	cases := []struct {
		name   string
		edit   func(*sluice.Policy)
		field  string // "" = valid
		substr string
	}{
		{"valid", func(p *sluice.Policy) {}, "", ""},
		{"empty id", func(p *sluice.Policy) { p.ID = "" }, "id", "1 to 64"},
		{"id with a brace", func(p *sluice.Policy) { p.ID = "a{b}" }, "id", "A-Z"},
		{"id too long", func(p *sluice.Policy) { p.ID = string(make([]byte, 65)) }, "id", "1 to 64"},
		{"negative revision", func(p *sluice.Policy) { p.Revision = -1 }, "revision", "between 1"},
		{"no algorithm", func(p *sluice.Policy) { p.Algorithm = 0 }, "algorithm", "one of"},
		{"zero limit", func(p *sluice.Policy) { p.Limit = 0 }, "limit", "between 1 and"},
		{"negative limit", func(p *sluice.Policy) { p.Limit = -3 }, "limit", "between 1 and"},
		{"absurd limit", func(p *sluice.Policy) { p.Limit = 1e12 }, "limit", "between 1 and"},
		{"zero window", func(p *sluice.Policy) { p.Window = 0 }, "window", "between 1ms and 365 days"},
		{"window below 1ms", func(p *sluice.Policy) { p.Window = 999 * time.Microsecond }, "window", "between 1ms and 365 days"},
		{"window of 1ms", func(p *sluice.Policy) { p.Window = time.Millisecond }, "", ""},
		{"window above 365 days", func(p *sluice.Policy) { p.Window = 365*24*time.Hour + time.Microsecond }, "window", "between 1ms and 365 days"},
		{"fractional µs window", func(p *sluice.Policy) { p.Window = time.Second + 1 }, "window", "whole number of microseconds"},
		{"burst on fixed window", func(p *sluice.Policy) { p.Burst = 5 }, "burst", "only to token_bucket and gcra"},
		{"burst on gcra", func(p *sluice.Policy) { p.Algorithm, p.Burst = sluice.GCRA, 5 }, "", ""},
		{"negative burst", func(p *sluice.Policy) { p.Algorithm, p.Burst = sluice.TokenBucket, -1 }, "burst", "between 1 and"},
		{"burst too large to stay exact", func(p *sluice.Policy) {
			p.Algorithm, p.Burst, p.Window = sluice.TokenBucket, 1_000_000, 24*time.Hour
		}, "burst", "2^53"},
		{"100k/s", func(p *sluice.Policy) { p.Algorithm, p.Limit = sluice.GCRA, 100_000 }, "", ""},
		{"huge sliding log", func(p *sluice.Policy) { p.Algorithm, p.Limit = sluice.SlidingLog, 1_000_000 }, "limit", "sliding_window"},
		{"negative max cost", func(p *sluice.Policy) { p.MaxCost = -1 }, "max_cost", "between 1 and 10"},
		{"max cost above limit", func(p *sluice.Policy) { p.MaxCost = 11 }, "max_cost", "between 1 and 10"},
		{"max cost above burst", func(p *sluice.Policy) { p.Algorithm, p.Burst, p.MaxCost = sluice.GCRA, 3, 4 }, "max_cost", "between 1 and 3"},
		{"negative grace", func(p *sluice.Policy) { p.CleanupGrace = -time.Second }, "cleanup_grace", "between 0s and 1h"},
		{"concurrency", func(p *sluice.Policy) { p.Algorithm, p.Window, p.LeaseTTL = sluice.Concurrency, 0, 30*time.Second }, "", ""},
		{"concurrency without lease ttl", func(p *sluice.Policy) { p.Algorithm, p.Window = sluice.Concurrency, 0 }, "lease_ttl", "concurrency requires it"},
		{"concurrency with a window", func(p *sluice.Policy) { p.Algorithm, p.LeaseTTL = sluice.Concurrency, time.Second }, "window", "does not apply to concurrency"},
		{"lease ttl above 24h", func(p *sluice.Policy) { p.Algorithm, p.Window, p.LeaseTTL = sluice.Concurrency, 0, 25*time.Hour }, "lease_ttl", "between 1ms and 24h"},
		{"lease ttl below 1ms", func(p *sluice.Policy) { p.Algorithm, p.Window, p.LeaseTTL = sluice.Concurrency, 0, time.Microsecond }, "lease_ttl", "between 1ms and 24h"},
		{"lease ttl on fixed window", func(p *sluice.Policy) { p.LeaseTTL = time.Second }, "lease_ttl", "only to concurrency"},
		{"huge concurrency", func(p *sluice.Policy) {
			p.Algorithm, p.Window, p.LeaseTTL, p.Limit = sluice.Concurrency, 0, time.Second, 200_000
		}, "limit", "at most 100000"},
		{"max cost on concurrency", func(p *sluice.Policy) {
			p.Algorithm, p.Window, p.LeaseTTL, p.MaxCost = sluice.Concurrency, 0, time.Second, 2
		}, "max_cost", "one slot"},
		{"local quota", func(p *sluice.Policy) { p.Limit, p.LocalQuota = 100, sluice.LocalQuota{Enabled: true} }, "", ""},
		{"local quota on gcra with its numbers", func(p *sluice.Policy) {
			p.Algorithm, p.Limit, p.LocalQuota = sluice.GCRA, 1000, sluice.LocalQuota{Enabled: true, BlockTime: 50 * time.Millisecond, MaxBlock: 500}
		}, "", ""},
		{"local quota on a small limit", func(p *sluice.Policy) { p.Limit, p.LocalQuota.Enabled = 7, true }, "local_quota", "needs a max_cost of at least 8, not 7"},
		{"local quota on sliding_window", func(p *sluice.Policy) {
			p.Algorithm, p.Limit, p.LocalQuota.Enabled = sluice.SlidingWindow, 1000, true
		}, "local_quota", "does not apply to sliding_window"},
		{"local quota on sliding_log", func(p *sluice.Policy) { p.Algorithm, p.Limit, p.LocalQuota.Enabled = sluice.SlidingLog, 1000, true }, "local_quota", "does not apply to sliding_log"},
		{"local quota on a 5ms window", func(p *sluice.Policy) {
			p.Limit, p.Window, p.LocalQuota.Enabled = 100, 5*time.Millisecond, true
		}, "", ""},
		{"local quota on a 1ms window", func(p *sluice.Policy) {
			p.Limit, p.Window, p.LocalQuota.Enabled = 100, time.Millisecond, true
		}, "local_quota", "needs blocks of at least 1ms"},
		{"local quota numbers while off", func(p *sluice.Policy) { p.Limit, p.LocalQuota.MaxBlock = 1000, 10 }, "local_quota.enabled", "must be true"},
		{"local quota block longer than half the window", func(p *sluice.Policy) {
			p.Limit, p.LocalQuota = 1000, sluice.LocalQuota{Enabled: true, BlockTime: 600 * time.Millisecond}
		}, "local_quota.block_time", "at most half the window"},
		{"local quota block longer than half the burst's refill", func(p *sluice.Policy) {
			p.Algorithm, p.Limit, p.Burst, p.LocalQuota = sluice.GCRA, 1000, 100, sluice.LocalQuota{Enabled: true, BlockTime: 60 * time.Millisecond}
		}, "local_quota.block_time", "(50ms)"},
		{"local quota block above half of max cost", func(p *sluice.Policy) {
			p.Limit, p.LocalQuota = 1000, sluice.LocalQuota{Enabled: true, MaxBlock: 501}
		}, "local_quota.max_block", "between 4 and 500"},
		{"near cache on concurrency", func(p *sluice.Policy) {
			p.Algorithm, p.Window, p.LeaseTTL, p.NearCache = sluice.Concurrency, 0, time.Second, true
		}, "near_cache", "release"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := base
			c.edit(&p)
			err := p.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", p, err)
				}
				return
			}
			var pe *policyerr.Error
			if !errors.As(err, &pe) {
				t.Fatalf("Validate(%+v) = %v, want a *policyerr.Error on %s", p, err, c.field)
			}
			if pe.Field != c.field || pe.Policy != p.ID || pe.Value == "" || !contains(pe.Rule, c.substr) {
				t.Fatalf("Validate(%+v) = %+v, want field %q with a rule mentioning %q", p, pe, c.field, c.substr)
			}
		})
	}
}

func TestPolicyDefaults(t *testing.T) {
	p := evaluation.Defaults(sluice.Policy{ID: "b", Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Second, Burst: 4})
	if p.Revision != 1 || p.Burst != 4 || p.MaxCost != 4 {
		t.Fatalf("evaluation.Defaults = %+v, want revision 1, burst 4, max cost 4 (the burst)", p)
	}
	p = evaluation.Defaults(sluice.Policy{ID: "f", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Second})
	if p.Burst != 10 || p.MaxCost != 10 {
		t.Fatalf("evaluation.Defaults = %+v, want burst and max cost = limit 10", p)
	}
}

func TestAlgorithmText(t *testing.T) {
	for a, want := range map[sluice.Algorithm]string{sluice.FixedWindow: "fixed_window", sluice.SlidingLog: "sliding_log", sluice.SlidingWindow: "sliding_window", sluice.TokenBucket: "token_bucket", sluice.GCRA: "gcra", sluice.Concurrency: "concurrency", sluice.Algorithm(42): "Algorithm(42)"} {
		if got := a.String(); got != want {
			t.Errorf("Algorithm(%d).String() = %q, want %q", a, got, want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
