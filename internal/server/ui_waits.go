package server

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// The dashboard's Queues, Waits booked and Priorities tables (issue 34):
// like the Settles table, each reads its counters back from the
// registry's collectors, since the server started, creating no series.

// uiQueue is one proxy route's row of the Queues table: its max_delay
// queue, from sluice_proxy_queued_total, sluice_proxy_queue_wait_seconds
// and sluice_proxy_queue_dropped_total.
type uiQueue struct {
	Route string `json:"route"`
	// Queued are the requests held for their booked slot, then sent on.
	Queued int64 `json:"queued"`
	// MeanWaitMS is the mean time they were held (the histogram's sum
	// over its count), in ms; 0 when none was held.
	MeanWaitMS float64 `json:"mean_wait_ms"`
	// Dropped by reason: the slot lay past max_delay, the queue was full,
	// the client went away while held.
	PastMaxDelay int64 `json:"past_max_delay"`
	QueueFull    int64 `json:"queue_full"`
	Abandoned    int64 `json:"abandoned"`
}

// uiBooked is one policy's row of the Waits booked table, from
// sluice_booked_delay_seconds: the admitted bookings told to wait (op
// book of the check API, and the max_delay queues' bookings).
type uiBooked struct {
	Policy string `json:"policy"`
	Waits  int64  `json:"waits"`
	// MeanDelayMS is the mean delay they were told (sum over count), ms.
	MeanDelayMS float64 `json:"mean_delay_ms"`
}

// uiPriority is one row of the Priorities table: a class of a policy
// that declares priority classes, its share of the policy's capacity
// (the running config's; default is 100 unless declared), and its
// decisions from sluice_decisions_by_priority_total.
type uiPriority struct {
	Policy  string `json:"policy"`
	Class   string `json:"class"`
	Share   int    `json:"share"`
	Allowed int64  `json:"allowed"`
	Denied  int64  `json:"denied"`
	// Undecided adds the unavailable, indeterminate and incompatible
	// answers.
	Undecided int64 `json:"undecided"`
}

// sample is one series read back from a collector: its labels, a
// counter's value, a histogram's count and sum.
type sample struct {
	labels       map[string]string
	value, count float64
	sum          float64
}

// samples reads back every series c has, creating none.
func samples(c prometheus.Collector) []sample {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	var out []sample
	for metric := range ch {
		var d dto.Metric
		if metric.Write(&d) != nil {
			continue
		}
		s := sample{labels: map[string]string{}, value: d.GetCounter().GetValue()}
		for _, l := range d.GetLabel() {
			s.labels[l.GetName()] = l.GetValue()
		}
		if h := d.GetHistogram(); h != nil {
			s.count, s.sum = float64(h.GetSampleCount()), h.GetSampleSum()
		}
		out = append(out, s)
	}
	return out
}

// meanMS is sum/count in ms, 0 for no count.
func meanMS(sum, count float64) float64 {
	if count == 0 {
		return 0
	}
	return sum / count * 1000
}

// queueTotals is the Queues table: one row per route with a series,
// sorted; an empty list when no route held or dropped anything.
func (m *Metrics) queueTotals() []uiQueue {
	rows := map[string]*uiQueue{}
	row := func(route string) *uiQueue {
		if rows[route] == nil {
			rows[route] = &uiQueue{Route: route}
		}
		return rows[route]
	}
	for _, s := range samples(m.queued) {
		row(s.labels["route"]).Queued = int64(s.value)
	}
	for _, s := range samples(m.waited) {
		row(s.labels["route"]).MeanWaitMS = meanMS(s.sum, s.count)
	}
	for _, s := range samples(m.dropped) {
		r := row(s.labels["route"])
		switch s.labels["reason"] {
		case "past_max_delay":
			r.PastMaxDelay = int64(s.value)
		case "queue_full":
			r.QueueFull = int64(s.value)
		case "abandoned":
			r.Abandoned = int64(s.value)
		}
	}
	out := []uiQueue{}
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b uiQueue) int { return cmp.Compare(a.Route, b.Route) })
	return out
}

// bookedTotals is the Waits booked table: one row per policy label with
// a series, those of ids first in their order, then the others sorted;
// an empty list when no booking waited.
func (m *Metrics) bookedTotals(ids []string) []uiBooked {
	rows := map[string]uiBooked{}
	for _, s := range samples(m.booked) {
		p := s.labels["policy"]
		rows[p] = uiBooked{Policy: p, Waits: int64(s.count), MeanDelayMS: meanMS(s.sum, s.count)}
	}
	out := []uiBooked{}
	for _, p := range inOrder(ids, rows) {
		out = append(out, rows[p])
	}
	return out
}

// inOrder returns the keys of rows, those of ids first in their order,
// then the others sorted.
func inOrder[T any](ids []string, rows map[string]T) []string {
	var out, rest []string
	for _, id := range ids {
		if _, ok := rows[id]; ok {
			out = append(out, id)
		}
	}
	for k := range rows {
		if !slices.Contains(ids, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

// priorityTotals is the Priorities table: for each of ids whose policy
// (from policy) declares priority classes, one row per class it declares
// and default, sorted by share (most first) then name, with its
// decisions since the server started (0 when none); an empty list when
// no policy declares classes.
func (m *Metrics) priorityTotals(ids []string, policy func(string) (sluice.Policy, bool)) []uiPriority {
	type key struct{ policy, class string }
	counts := map[key]*uiPriority{}
	for _, s := range samples(m.classes) {
		k := key{s.labels["policy"], s.labels["priority"]}
		r := counts[k]
		if r == nil {
			r = &uiPriority{}
			counts[k] = r
		}
		switch n := int64(s.value); s.labels["outcome"] {
		case sluice.Allowed.String():
			r.Allowed += n
		case sluice.Denied.String():
			r.Denied += n
		default:
			r.Undecided += n
		}
	}
	out := []uiPriority{}
	for _, id := range ids {
		p, ok := policy(id)
		if !ok || len(p.Priorities) == 0 {
			continue
		}
		var rows []uiPriority
		for class, share := range p.Priorities {
			rows = append(rows, uiPriority{Class: class, Share: share})
		}
		if _, ok := p.Priorities[algorithm.DefaultClass]; !ok {
			rows = append(rows, uiPriority{Class: algorithm.DefaultClass, Share: 100})
		}
		slices.SortFunc(rows, func(a, b uiPriority) int { return cmp.Or(cmp.Compare(b.Share, a.Share), cmp.Compare(a.Class, b.Class)) })
		for _, r := range rows {
			if c := counts[key{id, r.Class}]; c != nil {
				r.Allowed, r.Denied, r.Undecided = c.Allowed, c.Denied, c.Undecided
			}
			r.Policy = id
			out = append(out, r)
		}
	}
	return out
}
