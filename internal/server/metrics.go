package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/localquota"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/clock"
)

// UnknownPolicy is the policy label of a check that names a policy the
// server does not have: the name comes from the client, so it never
// becomes a label value.
const UnknownPolicy = "(unknown)"

// Metrics are the Prometheus collectors of sluice serve, registered on a
// registry the caller creates and owns (no global registry):
//
//   - sluice_decisions_total{policy, outcome}: spending decisions of the
//     check API, the proxy and the Envoy service, counted by the edge core
//     (internal/edge), one count per policy the request named, the
//     config's and the rules files' by their IDs,
//     with the request's outcome (allowed, denied, unavailable,
//     incompatible, indeterminate). Peeks and refunds spend nothing and
//     are not counted.
//   - sluice_decisions_by_priority_total{policy, priority, outcome}: the
//     same decisions of the policies that declare priority classes, per
//     class (the dashboard's Priorities table reads it): the class the
//     request named if the policy declares it, else default (a request
//     naming none, or a class only another policy declares). Policies
//     without classes are left out: there it would repeat
//     sluice_decisions_total under priority="default".
//   - sluice_booked_delay_seconds{policy}: how long each admitted booking
//     (op book of the check API, Limiter.Reserve behind it, the proxy's
//     and the middlewares' max_delay queues) was told to wait for its
//     slot; bookings admitted at once are not observed. Its _count is
//     the waits booked, its _sum their delays.
//   - sluice_settled_units_total{policy, kind}: what the settles of
//     estimates did (op settle of the check API, the proxy's and the
//     middleware's settle_header, Envoy's stream-done call), per policy,
//     in units (the dashboard's Settles table reads it): kind charged
//     (beyond the estimate, past the limit if need be), given_back (of
//     the estimate), owed (the debt past the capacity each settle left,
//     summed over settles). Estimates count as decisions above.
//   - sluice_decision_duration_seconds{store}: how long the store took
//     per evaluation (see InstrumentStore).
//   - sluice_http_requests_total{handler, code}: answers per handler
//     ("POST /v1/check", "GET /healthz", …, "proxy", or "unmatched") and
//     status code.
//   - sluice_proxy_decisions_total{route, action, shadow}: what the proxy
//     did per route (admitted, limited, failed_closed, failed_open,
//     no_subject); shadow="true" counts what a shadow route would have
//     done but did not enforce.
//   - sluice_proxy_local_decisions_total{route, outcome}: answers of the
//     local fallback while the store could not decide.
//   - sluice_proxy_queued_total{route}, sluice_proxy_queue_wait_seconds
//     {route} and sluice_proxy_queue_dropped_total{route, reason}: a
//     route with max_delay: requests held for their booked slot, how
//     long each was held, and those refused (past_max_delay,
//     queue_full) or whose client went away while held (abandoned).
//   - sluice_local_quota_decisions_total{policy}, …_blocks_total,
//     …_units_total and …_unused_units_total: what local quota
//     (local_quota: true) did, per policy: requests admitted from blocks
//     without a store call, blocks taken (one store call each), the units
//     they took, and the units of blocks whose time ran out unspent.
//
// Every label value comes from the config or a fixed set: never a
// subject, key, address or tenant. The same decisions are also counted
// per second over the last LiveSeconds for the dashboard (GET /ui). Safe
// for concurrent use.
type Metrics struct {
	reg       *prometheus.Registry
	clock     sluice.Clock // the second live counts fall in
	live      *live
	policies  atomic.Pointer[map[string]bool] // see SetPolicies
	decisions *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	requests  *prometheus.CounterVec
	proxy     *prometheus.CounterVec
	local     *prometheus.CounterVec
	failures  *prometheus.CounterVec
	near      *prometheus.CounterVec
	settles   *prometheus.CounterVec
	classes   *prometheus.CounterVec
	booked    *prometheus.HistogramVec
	queued    *prometheus.CounterVec
	waited    *prometheus.HistogramVec
	dropped   *prometheus.CounterVec
	overrides *overridesCollector
	localQ    *localCollector
	// checkAnswers are requests' counters of POST /v1/check answered
	// 200 and 429, made on first use: a check then skips the label
	// lookup (and the code's formatting).
	checkAnswers [2]atomic.Pointer[prometheus.Counter]
}

// NewMetrics registers the collectors on reg. policies are the IDs the
// decisions may be labelled with; their counters start at zero so every
// series exists from the first scrape.
func NewMetrics(reg *prometheus.Registry, policies []string) (*Metrics, error) {
	m := &Metrics{
		reg:   reg,
		clock: clock.System{},
		live:  newLive(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Spending decisions, per policy the request named and the request's outcome.",
		}, []string{"policy", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_decision_duration_seconds",
			Help:    "Time the store took to evaluate one decision.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"store"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_http_requests_total",
			Help: "HTTP answers, per handler and status code.",
		}, []string{"handler", "code"}),
		proxy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_decisions_total",
			Help: "What the reverse proxy did with limited requests, per route and action; shadow=\"true\" was reported, not enforced.",
		}, []string{"route", "action", "shadow"}),
		local: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_local_decisions_total",
			Help: "Answers of the proxy's local fallback limiter while the store could not decide, per route and outcome.",
		}, []string{"route", "outcome"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_failures_total",
			Help: "Decisions the store could not take, per store and cause: failed_before_send, indeterminate, circuit_open, corrupt_state, clock_unsafe, deadline_passed, other.",
		}, []string{"store", "cause"}),
		near: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_near_cache_denials_total",
			Help: "Denials answered from the near cache (near_cache: true) without asking the store, per policy: the store calls it saved.",
		}, []string{"policy"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_settled_units_total",
			Help: "What settles of estimates did, per policy, in units: charged past the estimate, given_back of it, owed past the capacity after each settle (summed).",
		}, []string{"policy", "kind"}),
		classes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_by_priority_total",
			Help: "Spending decisions of the policies that declare priority classes, per policy, class (the request's if the policy declares it, else default) and outcome.",
		}, []string{"policy", "priority", "outcome"}),
		booked: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_booked_delay_seconds",
			Help:    "How long each admitted booking (op book, a max_delay queue) was told to wait for its slot, per policy; bookings admitted at once are not observed.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"policy"}),
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_queued_total",
			Help: "Requests of a route with max_delay held for their booked slot, then sent on.",
		}, []string{"route"}),
		waited: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_proxy_queue_wait_seconds",
			Help:    "How long each held request of a route with max_delay waited for its slot.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_queue_dropped_total",
			Help: "Requests of a route with max_delay not held: their slot lay past max_delay, the queue was full, or their client went away while held (reason past_max_delay, queue_full, abandoned).",
		}, []string{"route", "reason"}),
	}
	m.overrides = &overridesCollector{desc: prometheus.NewDesc("sluice_overrides",
		"Runtime overrides (tenant plans) per policy: the config file's and those set through the admin API.", []string{"policy"}, nil)}
	m.localQ = newLocalCollector()
	for _, c := range []prometheus.Collector{m.decisions, m.duration, m.requests, m.proxy, m.local, m.failures, m.near, m.settles, m.classes, m.booked, m.queued, m.waited, m.dropped, m.overrides, m.localQ} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.SetPolicies(policies)
	return m, nil
}

// SetPolicies makes ids the policy IDs decisions may be labelled with,
// after a config reload; their counters start at zero. Series of policies
// no longer configured stay until the process restarts.
func (m *Metrics) SetPolicies(ids []string) {
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
		for k := sluice.Allowed; k <= sluice.Indeterminate; k++ {
			m.decisions.WithLabelValues(id, k.String())
		}
	}
	m.policies.Store(&known)
	m.live.keep(known)
}

// CountEvictions serves a store's running counts of what it dropped alive
// at its size bound: states as sluice_store_evictions_total{store}, and
// remembered evaluation ids (unless ids is nil) apart, as
// sluice_store_evicted_ids_total{store}.
func (m *Metrics) CountEvictions(store string, states, ids func() int64) error {
	err := m.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "sluice_store_evictions_total",
		Help:        "Live states the store dropped at its size bound (memstore's MaxKeys): each such subject starts again from fresh state.",
		ConstLabels: prometheus.Labels{"store": store},
	}, func() float64 { return float64(states()) }))
	if err != nil || ids == nil {
		return err
	}
	return m.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "sluice_store_evicted_ids_total",
		Help:        "Remembered evaluation ids, not yet expired, the store forgot at its size bound: a retry carrying one is decided again, not replayed.",
		ConstLabels: prometheus.Labels{"store": store},
	}, func() float64 { return float64(ids()) }))
}

// CountSkippedOverrides serves a store's running count of the fields of
// its overrides that it skipped as unreadable (written by another tool or
// a later sluice) as sluice_overrides_skipped_total{store}.
func (m *Metrics) CountSkippedOverrides(store string, skipped func() int64) error {
	return m.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "sluice_overrides_skipped_total",
		Help:        "Fields of the store's overrides skipped as unreadable at a read (each read after a change counts each such field again): remove or rewrite them; the others apply.",
		ConstLabels: prometheus.Labels{"store": store},
	}, func() float64 { return float64(skipped()) }))
}

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// InstrumentStore returns st timing every Evaluate with clock into
// sluice_decision_duration_seconds{store}. store is a fixed name such as
// "memory" or "redis".
// Its failures are counted in sluice_store_failures_total{store,cause}.
// A store that keeps overrides (overrideStore) still does.
func (m *Metrics) InstrumentStore(st sluice.Store, store string, clock sluice.Clock) sluice.Store {
	ts := &timedStore{Store: st, obs: m.duration.WithLabelValues(store), failures: m.failures.MustCurryWith(prometheus.Labels{"store": store}), clock: clock}
	if os, ok := st.(overrideStore); ok {
		return &timedOverrideStore{timedStore: ts, overrideStore: os}
	}
	return ts
}

// overrideStore is a Store's way to keep overrides, as sluice.Limiter
// looks for it (see sluice.Limiter.SetOverride).
type overrideStore interface {
	PutOverride(ctx context.Context, o sluice.Override) error
	Overrides(ctx context.Context) ([]sluice.Override, error)
}

// timedOverrideStore is a timedStore over a store that keeps overrides.
type timedOverrideStore struct {
	*timedStore
	overrideStore
}

// overridesCollector serves sluice_overrides{policy}: how many overrides
// each policy has, read from the serving Limiter at scrape time.
type overridesCollector struct {
	desc   *prometheus.Desc
	counts atomic.Pointer[func(context.Context) map[string]int]
}

func (c *overridesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *overridesCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.counts.Load()
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for id, n := range (*f)(ctx) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), id)
	}
}

// countOverrides makes counts the source of sluice_overrides (the
// serving generation's).
func (m *Metrics) countOverrides(counts func(context.Context) map[string]int) {
	m.overrides.counts.Store(&counts)
}

// localCollector serves sluice_local_quota_*: what local quota did, as
// every generation's Limiters told it (sluice.Options.OnLocalQuota, which
// the server sets to countLocal), so the counters never go back on a
// reload.
type localCollector struct {
	descs [4]*prometheus.Desc // decisions, blocks, units, unused
	tally localquota.Tally
}

func newLocalCollector() *localCollector {
	c := &localCollector{}
	for i, what := range [...][2]string{
		{"decisions", "Requests admitted from a block of local quota (local_quota: true) without a store call, per policy."},
		{"blocks", "Blocks of local quota taken, one store call each, per policy."},
		{"units", "Units the blocks of local quota took from the store, per policy."},
		{"unused_units", "Units of blocks of local quota whose time ran out before they were admitted: spent in the store, admitted to nobody, per policy (counted when the subject is next seen or forgotten)."},
	} {
		c.descs[i] = prometheus.NewDesc("sluice_local_quota_"+what[0]+"_total", what[1], []string{"policy"}, nil)
	}
	return c
}

func (c *localCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *localCollector) Collect(ch chan<- prometheus.Metric) {
	c.tally.Range(func(id string, s localquota.Stats) {
		for i, v := range [...]int64{s.Local, s.Blocks, s.Units, s.Unused} {
			ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.CounterValue, float64(v), id)
		}
	})
}

// countLocal counts what local quota did for a policy, as a Limiter
// tells it (sluice.Options.OnLocalQuota); nil-safe, for a server without
// metrics.
func (m *Metrics) countLocal(policy string, local, blocks, units, unused int64) {
	if m != nil {
		m.localQ.tally.Add(policy, local, blocks, units, unused)
	}
}

type timedStore struct {
	sluice.Store
	obs      prometheus.Observer
	failures *prometheus.CounterVec
	clock    sluice.Clock
}

// Unwrap returns the store s times, which a trace names.
func (s *timedStore) Unwrap() sluice.Store { return s.Store }

func (s *timedStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	start := s.clock.Now()
	err := s.Store.Evaluate(ctx, ev)
	s.obs.Observe(s.clock.Now().Sub(start).Seconds())
	if err != nil {
		s.failures.WithLabelValues(failureCause(err)).Inc()
	}
	return err
}

// failureCause names the sentinel err wraps, from a fixed set.
func failureCause(err error) string {
	for _, c := range []struct {
		err   error
		cause string
	}{
		{sluice.ErrIndeterminate, "indeterminate"}, // first: a lost reply may wrap a context error
		{sluice.CircuitOpen, "circuit_open"},
		{sluice.CorruptState, "corrupt_state"},
		{sluice.ClockUnsafe, "clock_unsafe"},
		{sluice.FailedBeforeSend, "failed_before_send"},
		{context.DeadlineExceeded, "deadline_passed"},
		{context.Canceled, "deadline_passed"},
	} {
		if errors.Is(err, c.err) {
			return c.cause
		}
	}
	return "other"
}

// policyLabel bounds a policy ID to the configured ones.
func (m *Metrics) policyLabel(id string) string {
	if (*m.policies.Load())[id] {
		return id
	}
	return UnknownPolicy
}

// count counts o once per policy of the request, and per class on the
// policies that declare classes (classes, see edge.CountFunc): the edge
// core's counter of every edge of the server. A nil m counts nothing.
func (m *Metrics) count(policies, classes []string, o sluice.Outcome) {
	if m == nil {
		return
	}
	kind := o.Kind.String()
	sec := m.clock.Now().Unix()
	for i, id := range policies {
		label := m.policyLabel(id)
		m.decisions.WithLabelValues(label, kind).Inc()
		m.live.add(label, o.Kind, sec)
		if o.FromCache && len(policies) == 1 {
			m.near.WithLabelValues(label).Inc()
		}
		if i < len(classes) && classes[i] != "" {
			m.classes.WithLabelValues(label, classes[i], kind).Inc()
		}
		if o.Kind == sluice.Allowed {
			if d := statusOf(&o, i).Delay; d > 0 {
				m.booked.WithLabelValues(label).Observe(d.Seconds())
			}
		}
	}
}

// statusOf is o's Status of its i-th policy.
func statusOf(o *sluice.Outcome, i int) *sluice.Status {
	if i < len(o.Statuses) {
		return &o.Statuses[i]
	}
	return &o.Status
}

// settled counts o, the outcome of a settle of policies, per policy on
// sluice_settled_units_total: the edge core's settle counter. A nil m
// counts nothing; a settle not taken counts nothing.
func (m *Metrics) settled(policies, _ []string, o sluice.Outcome) {
	if m == nil || o.Kind != sluice.Allowed || o.Replayed {
		return
	}
	statuses := o.Statuses
	if len(statuses) == 0 {
		statuses = []sluice.Status{o.Status}
	}
	for i, st := range statuses {
		if i >= len(policies) {
			break
		}
		label := m.policyLabel(policies[i])
		m.settles.WithLabelValues(label, "charged").Add(float64(st.Charged))
		m.settles.WithLabelValues(label, "given_back").Add(float64(st.GivenBack))
		m.settles.WithLabelValues(label, "owed").Add(float64(st.Owed))
	}
}

// countRequest counts one answer of handler.
func (m *Metrics) countRequest(handler string, code int) {
	if handler == checkPattern && (code == http.StatusOK || code == http.StatusTooManyRequests) {
		slot := &m.checkAnswers[0]
		if code == http.StatusTooManyRequests {
			slot = &m.checkAnswers[1]
		}
		c := slot.Load()
		if c == nil {
			made := m.requests.WithLabelValues(handler, strconv.Itoa(code))
			c = &made
			slot.Store(c)
		}
		(*c).Inc()
		return
	}
	m.requests.WithLabelValues(handler, strconv.Itoa(code)).Inc()
}

// onProxyDecision records what the proxy middleware did (the decision
// itself is counted by the edge core, see Proxy.ServeHTTP).
func (m *Metrics) onProxyDecision(d httplimit.Decision) {
	m.proxy.WithLabelValues(d.Operation, d.Action, strconv.FormatBool(d.Shadow)).Inc()
	if d.Local {
		m.local.WithLabelValues(d.Operation, d.LocalOutcome.Kind.String()).Inc()
	}
	switch d.Queue {
	case "":
	case "waited":
		m.queued.WithLabelValues(d.Operation).Inc()
		m.waited.WithLabelValues(d.Operation).Observe(d.Waited.Seconds())
	default:
		m.dropped.WithLabelValues(d.Operation, d.Queue).Inc()
	}
}
