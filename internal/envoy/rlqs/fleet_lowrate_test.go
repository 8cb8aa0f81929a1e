package rlqs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// lowPolicy is a row of TestFleetLowRate: the policy (rate a second,
// burst), the least share of r·T the fleet must admit in the steady part
// of every phase, and what it admitted there with the encoding this test
// came with (whole tokens per whole second, each share rounded down: 6.2/s
// sent as 6/s, a quiet proxy's 1.3/s as 1/s, 0.625/s as one token every
// 2 s), measured on main at 8778919, by phase.
type lowPolicy struct {
	rate, burst int
	least       float64
	before      map[string]float64
}

// TestFleetLowRate: 16 proxies share a modest limit under the skewed
// demand of TestFleetSkewedDemand (scaled to the limit), on one `sluice
// serve`. Each share is a few tokens a second or less, so how a share is
// written as a token bucket decides how much of the limit the fleet can
// use: rounded down to whole tokens per whole second it lost up to a
// fifth. The fleet stays within the bound r·T + b + M in every row.
//
// The rows: 100 a second with burst 100 (the policy's default), where a
// quiet proxy's share of the burst is one token, and one token of burst
// caps what a proxy whose requests come 0.5 s apart can take at 1 a
// second whatever its rate (the burst, not the encoding, is what is lost
// there; docs/rlqs.md, "Small bursts"); 100 a second with burst 200; and
// 10 a second with burst 160, under one token a second a proxy.
func TestFleetLowRate(t *testing.T) {
	for _, pol := range []lowPolicy{
		{100, 100, 0.90, map[string]float64{"90% at proxy 0": 94.0, "90% at proxy 15": 90.7, "even": 96.4}},
		{100, 200, 0.95, map[string]float64{"90% at proxy 0": 94.0, "90% at proxy 15": 90.8, "even": 96.4}},
		{10, 160, 0.90, map[string]float64{"90% at proxy 0": 85.0, "90% at proxy 15": 93.0, "even": 79.5}},
	} {
		t.Run(fmt.Sprintf("r=%d,b=%d", pol.rate, pol.burst), func(t *testing.T) { lowRateFleet(t, pol) })
	}
}

func lowRateFleet(t *testing.T, pol lowPolicy) {
	rate, burst := pol.rate, pol.burst
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
			label, ph.name, from, to, got, want, pol.before[ph.name], 100*got/want)
		if got < pol.least*want {
			t.Errorf("%s, %s: admitted %.0f in [%v, %v), want ≥ %.0f%% of r·T = %.0f", label, ph.name, got, from, to, 100*pol.least, pol.least*want)
		}
		start = to
	}
	var sum float64
	for _, p := range fleet.proxies {
		sum += ratePerSecond(p)
	}
	t.Logf("%s: at the end the proxies enforce %.3f tokens/s in all (r = %d)", label, sum, rate)
}
