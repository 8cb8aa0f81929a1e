package rlqs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// lowRateBefore is what this test measured, phase by phase, with the
// encoding it replaced (whole tokens per whole second, each share rounded
// down: 6.2/s sent as 6/s, a quiet proxy's 1.3/s as 1/s, 0.625/s as one
// token every 2 s), on main at 8778919: the steady part's admissions as a
// share of r·T, by policy rate.
var lowRateBefore = map[int]map[string]float64{
	100: {"90% at proxy 0": 94.0, "90% at proxy 15": 90.7, "even": 96.4},
	10:  {"90% at proxy 0": 85.0, "90% at proxy 15": 93.0, "even": 79.5},
}

// TestFleetLowRate: 16 proxies share a modest limit under the skewed
// demand of TestFleetSkewedDemand (scaled to the limit), on one `sluice
// serve`: 100 a second, burst 100 (the policy's default), about 6 tokens
// a second a proxy; and 10 a second, burst 160 (enough for a floor's
// token, see docs/rlqs.md), under one token a second a proxy. Each share
// is a few tokens a second or less, so how a share is written as a token
// bucket decides how much of the limit the fleet can use: rounded down to
// whole tokens per whole second it lost up to a fifth. The fleet stays
// within the bound r·T + b + M and admits at least 90 % of r·T in the
// steady part of every phase.
func TestFleetLowRate(t *testing.T) {
	for _, pol := range []struct{ rate, burst int }{{100, 100}, {10, 160}} {
		t.Run(fmt.Sprintf("r=%d", pol.rate), func(t *testing.T) { lowRateFleet(t, pol.rate, pol.burst) })
	}
}

func lowRateFleet(t *testing.T, rate, burst int) {
	const n = 16
	ctx := guard(t, 3*time.Minute)
	sv := startServe(t, policyConfig("", 1000, 10000, rate, burst))
	fleet := &sim{t: t, ctx: ctx, servers: []*servetest.Process{sv},
		proxies: dialFleet(t, n, func(int) string { return sv.RLSAddr() }, nil)}
	phases := skewPhases(n)
	for i := range phases {
		for j := range phases[i].offer {
			phases[i].offer[j] *= float64(rate) / fleetRate
		}
		fleet.run(phases[i])
	}
	label := fmt.Sprintf("r = %d/s, b = %d, N = %d", rate, burst, n)
	assertPolicyBound(t, label, fleet.proxies, fleet.now, float64(rate), float64(burst))
	var start time.Duration
	for _, ph := range phases {
		from, to := start+settle, start+ph.dur
		want := float64(rate) * (to - from).Seconds()
		got := float64(admitted(fleet.proxies, from, to))
		t.Logf("%s, %s, steady part [%v, %v): admitted %.0f of r·T = %.0f: before %.1f%% → now %.1f%%",
			label, ph.name, from, to, got, want, lowRateBefore[rate][ph.name], 100*got/want)
		if got < 0.9*want {
			t.Errorf("%s, %s: admitted %.0f in [%v, %v), want ≥ 90%% of r·T = %.0f", label, ph.name, got, from, to, 0.9*want)
		}
		start = to
	}
	var sum float64
	for _, p := range fleet.proxies {
		sum += ratePerSecond(p)
	}
	t.Logf("%s: at the end the proxies enforce %.3f tokens/s in all (r = %d)", label, sum, rate)
}
