package rlqs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// phaseLen and settle: each phase of demand lasts 40 virtual seconds, and
// its steady part, where utilization is measured, starts 20 s (four
// reports) in. The smoothed demand (α = ½ a report) of a proxy whose
// demand fell from 90 % to under 1 % of the offered halves each report,
// and its share, above what it uses, with it: measured from 10 s after
// the move, the N = 16 fleet admitted 85.7 % of r·T; from 20 s, the old
// demand weighs 1/16 and every share sits at or below its demand.
const (
	phaseLen = 40 * time.Second
	settle   = 20 * time.Second
)

// skewPhases are the demand for n proxies: 90 % at proxy 0, then
// at proxy n−1 (3 times the limit offered in all), then even (1.5 times
// the limit at each proxy).
func skewPhases(n int) []phase {
	return []phase{
		skewed("90% at proxy 0", n, 0, phaseLen),
		skewed(fmt.Sprintf("90%% at proxy %d", n-1), n, n-1, phaseLen),
		skewed("even", n, -1, phaseLen),
	}
}

// TestFleetSkewedDemand: N proxies on one `sluice serve` share one limit
// (r = 400/s, b = 400) under skewed demand that moves; in every 1 s and
// 10 s window and over the whole run the fleet admits within r·T + b + M
// (+ F = 0, X = 0), and in the steady part of each phase at least 90 %
// of r·T. The same demand against the static split (every proxy the
// whole limit, as jukie/rlqs answers) is the baseline, run alongside:
// it admits Σ min(offered_i, r), N × the limit when every proxy is over
// it (the even phase).
func TestFleetSkewedDemand(t *testing.T) {
	for _, n := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			ctx := guard(t, 3*time.Minute)
			sv := startServe(t, fleetConfig("", 1000, 10000))
			fleet := &sim{t: t, ctx: ctx, servers: []*servetest.Process{sv},
				proxies: dialFleet(t, n, func(int) string { return sv.RLSAddr() }, nil)}
			static := startStatic(t)
			base := &sim{t: t, ctx: ctx, proxies: dialFleet(t, n, func(int) string { return static }, nil)}
			phases := skewPhases(n)
			for _, ph := range phases {
				fleet.run(ph)
				base.run(ph)
			}
			assertBound(t, fmt.Sprintf("N=%d", n), fleet.proxies, fleet.now)
			var start time.Duration
			for _, ph := range phases {
				from, to := start+settle, start+ph.dur
				want := fleetRate * (to - from).Seconds()
				got, bl := float64(admitted(fleet.proxies, from, to)), float64(admitted(base.proxies, from, to))
				t.Logf("N=%d %s, steady part [%v, %v): sluice admits %.0f = %.1f%% of r·T; static split %.0f = %.2f × r·T",
					n, ph.name, from, to, got, 100*got/want, bl, bl/want)
				if got < 0.9*want {
					t.Errorf("N=%d %s: admitted %.0f in [%v, %v), want ≥ 90%% of r·T = %.0f", n, ph.name, got, from, to, 0.9*want)
				}
				if ph.name == "even" && bl < 0.9*float64(n)*want {
					t.Errorf("N=%d static baseline, even demand: admitted %.0f, want about N × r·T = %.0f", n, bl, float64(n)*want)
				}
				start = to
			}
			logShares(t, fleet.proxies)
		})
	}
}

// logShares logs each proxy's assignment at the end.
func logShares(t *testing.T, ps []*envoyrlqs.Proxy) {
	t.Helper()
	var sum float64
	for _, p := range ps {
		sum += ratePerSecond(p)
	}
	t.Logf("at the end the %d proxies are assigned %.2f tokens/s in all (r = %d)", len(ps), sum, fleetRate)
}
