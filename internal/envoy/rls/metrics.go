package rls

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// NoRule is the rule label of descriptors no rule matched: their domain
// and entries come from the client, so they never become label values.
const NoRule = "(none)"

// Metrics are the Prometheus collectors of the rate-limit service,
// registered on a registry the caller owns:
//
//   - sluice_envoy_requests_total{code}: answers to ShouldRateLimit by
//     overall code (OK, OVER_LIMIT) or, for a failed call, gRPC status
//     code (Unavailable, InvalidArgument, …).
//   - sluice_envoy_descriptors_total{rule, code}: descriptor statuses by
//     rule (the policy ID derived from the rule's key, NoRule, or
//     OverrideRule for a descriptor's limit override) and
//     what became of them: ok, over_limit, shadow_over_limit (over the
//     limit but answered OK: shadow_mode), unlimited, failed_open,
//     released (an in-flight lease given back by the stream-done call),
//     settled (an estimate settled by the stream-done call) or unsettled
//     (a stream-done call that could not settle it),
//     replaced (a rule another matched rule's replaces dropped), or
//     no_rule.
//   - sluice_envoy_unsettled_total{rule, reason}: descriptors of rules
//     that settle on stream done (sluice_settle) whose cost could not be
//     settled: no_request_id, no_cost, no_estimate, unavailable,
//     limit_override (see match.go, settling).
//   - sluice_envoy_unknown_priority_total{rule}: descriptors whose
//     sluice_priority entry names a class their rule does not declare,
//     decided as the default class (see match.go, classOf); never the
//     class itself, which comes from the client.
//   - sluice_envoy_ignored_limit_total{rule}: descriptors whose limit
//     (RateLimitDescriptor.limit) their rule ignores: an in-flight rule
//     (sluice_in_flight) decides by its leases alone; never the numbers,
//     which come from the client.
//
// Label values come from the rules files or fixed sets, never from a
// descriptor value. Safe for concurrent use.
type Metrics struct {
	requests    *prometheus.CounterVec
	descriptors *prometheus.CounterVec
	unsettled   *prometheus.CounterVec
	// unknownPriority: descriptors of a class their rule does not declare.
	unknownPriority *prometheus.CounterVec
	// ignoredLimit: descriptors whose limit their (in-flight) rule ignores.
	ignoredLimit *prometheus.CounterVec

	// The counters every answer increments, found once: requests by
	// overall code (ok, over), and descriptors' by labels (a
	// descriptorLabels key, a prometheus.Counter value: the children of
	// descriptors, as many as it has), so an answer does not hash its
	// label values again to find them.
	ok, over    prometheus.Counter
	descriptorC sync.Map
}

// descriptorLabels are the label values of sluice_envoy_descriptors_total.
type descriptorLabels struct{ rule, code string }

// NewMetrics registers the collectors on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_requests_total",
			Help: "Answers to Envoy's ShouldRateLimit, by overall code or gRPC error code.",
		}, []string{"code"}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_descriptors_total",
			Help: "Descriptor statuses of Envoy rate-limit requests, by rule and result.",
		}, []string{"rule", "code"}),
		unsettled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_unsettled_total",
			Help: "Descriptors of rules that settle on stream done whose cost could not be settled, by rule and reason.",
		}, []string{"rule", "reason"}),
		unknownPriority: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_unknown_priority_total",
			Help: "Descriptors naming a priority class their rule does not declare, decided as the default class, by rule.",
		}, []string{"rule"}),
		ignoredLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_ignored_limit_total",
			Help: "Descriptors whose limit their rule ignores (an in-flight rule decides by its leases alone), by rule.",
		}, []string{"rule"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.descriptors, m.unsettled, m.unknownPriority, m.ignoredLimit} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.ok = m.requests.WithLabelValues(rlspb.RateLimitResponse_OK.String())
	m.over = m.requests.WithLabelValues(rlspb.RateLimitResponse_OVER_LIMIT.String())
	return m, nil
}
