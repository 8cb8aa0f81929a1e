package server

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// uiSettled is one policy's row of the dashboard's Settles table: the
// series of sluice_settled_units_total for it, in units, since the
// server started (summed over settles, as the counter is).
type uiSettled struct {
	Policy    string `json:"policy"`
	Charged   int64  `json:"charged"`
	GivenBack int64  `json:"given_back"`
	Owed      int64  `json:"owed"`
}

// settledTotals reads sluice_settled_units_total back, one row per policy
// label with a series, those of ids first in their order, then the
// others (the unknown policies' label) sorted; an empty list when nothing
// was settled. It reads only the series that exist, creating none.
func (m *Metrics) settledTotals(ids []string) []uiSettled {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		m.settles.Collect(ch)
		close(ch)
	}()
	rows := map[string]*uiSettled{}
	for metric := range ch {
		var d dto.Metric
		if metric.Write(&d) != nil {
			continue
		}
		var policy, kind string
		for _, l := range d.GetLabel() {
			switch l.GetName() {
			case "policy":
				policy = l.GetValue()
			case "kind":
				kind = l.GetValue()
			}
		}
		r := rows[policy]
		if r == nil {
			r = &uiSettled{Policy: policy}
			rows[policy] = r
		}
		v := int64(d.GetCounter().GetValue())
		switch kind {
		case "charged":
			r.Charged = v
		case "given_back":
			r.GivenBack = v
		case "owed":
			r.Owed = v
		}
	}
	out := []uiSettled{}
	for _, id := range ids {
		if r := rows[id]; r != nil {
			out = append(out, *r)
			delete(rows, id)
		}
	}
	rest := make([]string, 0, len(rows))
	for policy := range rows {
		rest = append(rest, policy)
	}
	slices.Sort(rest)
	for _, policy := range rest {
		out = append(out, *rows[policy])
	}
	return out
}
