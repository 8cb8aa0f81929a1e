package httplimit

import (
	"net/http"

	"github.com/sluicehq/sluice/internal/edge"
)

// serveSettled passes r, admitted as an estimate by a's decision of rt,
// to next, then settles the estimate with the cost next reported in
// rt's SettleHeader (a header or a trailer), or at the estimate when it
// reported none, or panicked (the panic goes on).
func (m *Middleware) serveSettled(w http.ResponseWriter, r *http.Request, next http.Handler, rt *route, d *Decision, a *edge.Action) {
	cost := rt.Cost
	defer func() {
		p := recover()
		m.core.Settle(r.Context(), rt.Rule, a, d.subject(), cost)
		if p != nil {
			panic(p)
		}
	}()
	next.ServeHTTP(w, r)
	h := w.Header()
	v := h.Get(rt.settle)
	if v == "" {
		v = h.Get(http.TrailerPrefix + rt.settle)
	}
	if used, ok := edge.ParseCost(v); ok {
		cost = used
	}
}
