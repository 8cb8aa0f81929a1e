package server

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
	rows := map[string]*uiSettled{}
	for _, s := range samples(m.settles) {
		policy := s.labels["policy"]
		r := rows[policy]
		if r == nil {
			r = &uiSettled{Policy: policy}
			rows[policy] = r
		}
		v := int64(s.value)
		switch s.labels["kind"] {
		case "charged":
			r.Charged = v
		case "given_back":
			r.GivenBack = v
		case "owed":
			r.Owed = v
		}
	}
	out := []uiSettled{}
	for _, policy := range inOrder(ids, rows) {
		out = append(out, *rows[policy])
	}
	return out
}
