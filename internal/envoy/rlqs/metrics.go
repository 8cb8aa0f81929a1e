package rlqs

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// unknownDomain is the domain label of streams whose domain no config
// names: the name comes from the client, so it never becomes a label.
const unknownDomain = "(none)"

// Metrics are the Prometheus collectors of the RLQS service, registered
// on a registry the caller owns. Labels are the domain and the policy,
// both from the config (never a bucket id's value):
//
//   - sluice_rlqs_streams{domain}, sluice_rlqs_buckets{domain, policy}:
//     streams served and buckets kept, at the last round.
//   - sluice_rlqs_demand{domain, policy}: the streams' smoothed demand,
//     requests per second; sluice_rlqs_assigned_rate{domain, policy} and
//     sluice_rlqs_assigned_burst{domain, policy}: what this instance's
//     streams are assigned, tokens per second and tokens.
//   - sluice_rlqs_reported_allowed_total, sluice_rlqs_reported_denied_total
//     {domain, policy}: what the streams reported.
//   - sluice_rlqs_rounds_total{domain}, sluice_rlqs_round_duration_seconds
//     {domain}, sluice_rlqs_ledger_calls_total{domain},
//     sluice_rlqs_ledger_errors_total{domain}.
//   - sluice_rlqs_unmatched_total{domain}: buckets no matcher matches,
//     answered ALLOW_ALL; sluice_rlqs_overflow_total{domain, policy}:
//     buckets past a cap, answered the equal split.
//
// Safe for concurrent use; a nil *Metrics counts nothing.
type Metrics struct {
	streams, buckets, demand, rate, burst *prometheus.GaugeVec
	allowed, denied, overflow             *prometheus.CounterVec
	rounds, calls, errors, unmatchedC     *prometheus.CounterVec
	duration                              *prometheus.HistogramVec
}

// NewMetrics registers the collectors on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	dp := []string{"domain", "policy"}
	g := func(name, help string, labels []string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	c := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &Metrics{
		streams:    g("sluice_rlqs_streams", "Envoy RLQS streams served, by domain.", []string{"domain"}),
		buckets:    g("sluice_rlqs_buckets", "RLQS buckets kept, by domain and policy.", dp),
		demand:     g("sluice_rlqs_demand", "Smoothed demand the RLQS streams report, requests per second.", dp),
		rate:       g("sluice_rlqs_assigned_rate", "Rate assigned to this instance's RLQS streams, tokens per second.", dp),
		burst:      g("sluice_rlqs_assigned_burst", "Burst assigned to this instance's RLQS streams, tokens.", dp),
		allowed:    c("sluice_rlqs_reported_allowed_total", "Requests the RLQS streams reported allowed.", dp),
		denied:     c("sluice_rlqs_reported_denied_total", "Requests the RLQS streams reported denied.", dp),
		overflow:   c("sluice_rlqs_overflow_total", "RLQS buckets past a cap, answered the equal split.", dp),
		rounds:     c("sluice_rlqs_rounds_total", "RLQS split rounds, by domain.", []string{"domain"}),
		calls:      c("sluice_rlqs_ledger_calls_total", "RLQS ledger calls, by domain.", []string{"domain"}),
		errors:     c("sluice_rlqs_ledger_errors_total", "RLQS ledger calls that failed, by domain.", []string{"domain"}),
		unmatchedC: c("sluice_rlqs_unmatched_total", "RLQS buckets no matcher matches, answered ALLOW_ALL.", []string{"domain"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_rlqs_round_duration_seconds",
			Help: "Duration of an RLQS split round, ledger call included.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"domain"}),
	}
	for _, col := range []prometheus.Collector{m.streams, m.buckets, m.demand, m.rate, m.burst, m.allowed, m.denied, m.overflow,
		m.rounds, m.calls, m.errors, m.unmatchedC, m.duration} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) unmatched(domain string, n int) {
	if m != nil && n > 0 {
		m.unmatchedC.WithLabelValues(domain).Add(float64(n))
	}
}

func (m *Metrics) overflowed(domain, policy string) {
	if m != nil {
		m.overflow.WithLabelValues(domain, policy).Inc()
	}
}

func (m *Metrics) reported(domain, policy string, allowed, denied uint64) {
	if m != nil {
		m.allowed.WithLabelValues(domain, policy).Add(float64(allowed))
		m.denied.WithLabelValues(domain, policy).Add(float64(denied))
	}
}

func (m *Metrics) ledgerCall(domain string) {
	if m != nil {
		m.calls.WithLabelValues(domain).Inc()
	}
}

func (m *Metrics) ledgerError(domain string) {
	if m != nil {
		m.errors.WithLabelValues(domain).Inc()
	}
}

// roundDone counts d's round and sets its gauges; d.mu held.
func (m *Metrics) roundDone(d *domain, took time.Duration) {
	if m == nil {
		return
	}
	m.rounds.WithLabelValues(d.name).Inc()
	m.duration.WithLabelValues(d.name).Observe(took.Seconds())
	m.streams.WithLabelValues(d.name).Set(float64(len(d.streams)))
	type sums struct{ buckets, demand, rate, burst float64 }
	by := map[string]*sums{}
	for _, b := range d.buckets {
		s := by[b.policy.ID]
		if s == nil {
			s = &sums{}
			by[b.policy.ID] = s
		}
		s.buckets++
		for _, h := range b.holds {
			s.demand += float64(h.demand) / 1000
			s.rate += float64(h.assigned.rate) / 1000
			s.burst += float64(h.assigned.burst) / 1000
		}
	}
	for p := range d.gauges {
		if by[p] == nil {
			for _, g := range []*prometheus.GaugeVec{m.buckets, m.demand, m.rate, m.burst} {
				g.DeleteLabelValues(d.name, p)
			}
			delete(d.gauges, p)
		}
	}
	for p, s := range by {
		d.gauges[p] = true
		m.buckets.WithLabelValues(d.name, p).Set(s.buckets)
		m.demand.WithLabelValues(d.name, p).Set(s.demand)
		m.rate.WithLabelValues(d.name, p).Set(s.rate)
		m.burst.WithLabelValues(d.name, p).Set(s.burst)
	}
}
