package server

import "github.com/sluicehq/sluice"

// SetMetricsClock makes m count live decisions in the seconds of clock,
// so tests on a fake clock can say which second a decision falls in.
func SetMetricsClock(m *Metrics, clock sluice.Clock) { m.clock = clock }

// Loopback reports whether a listen address accepts only local
// connections (the check API warns when it is open on any other).
var Loopback = loopback
