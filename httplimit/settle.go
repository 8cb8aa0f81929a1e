package httplimit

import (
	"cmp"
	"net/http"

	"github.com/sluicehq/sluice/internal/edge"
)

// serveSettled passes r, admitted as an estimate by a's decision of rt,
// to next, then settles the estimate with the cost next reported in
// rt's SettleHeader (see settleWriter.cost), or at the estimate when it
// reported none; a panic goes on once settled.
func (m *Middleware) serveSettled(w http.ResponseWriter, r *http.Request, next http.Handler, rt *route, d *Decision, a *edge.Action) {
	sw := &settleWriter{ResponseWriter: w, name: rt.settle}
	defer func() {
		p := recover()
		m.core.Settle(r.Context(), rt.Rule, a, d.subject(), sw.cost(rt.Cost, p == nil))
		if p != nil {
			panic(p)
		}
	}()
	next.ServeHTTP(sw, r)
}

// settleWriter is the ResponseWriter of a settling route's handler: it
// takes the settle header's value when the response's header is written
// (WriteHeader, or the first Write or Flush), before any of the body.
// A client that hangs up after that changes nothing of what the request
// is charged, though the handler then panics (httputil.ReverseProxy
// aborts with http.ErrAbortHandler) or never returns normally.
type settleWriter struct {
	http.ResponseWriter
	name  string // the settle header, canonical
	wrote bool   // the final header is written
	value string // the settle header's value then
}

// note takes the settle header's value as a final (not 1xx) header is
// written with status code.
func (sw *settleWriter) note(code int) {
	if !sw.wrote && code >= 200 {
		sw.wrote = true
		sw.value = sw.Header().Get(sw.name)
	}
}

func (sw *settleWriter) WriteHeader(code int) {
	sw.note(code)
	sw.ResponseWriter.WriteHeader(code)
}

func (sw *settleWriter) Write(b []byte) (int, error) {
	sw.note(http.StatusOK)
	return sw.ResponseWriter.Write(b)
}

// Flush writes the header (and what is buffered) out, as the
// ResponseWriter beneath does, for handlers that stream.
func (sw *settleWriter) Flush() {
	sw.note(http.StatusOK)
	_ = http.NewResponseController(sw.ResponseWriter).Flush() // a writer that cannot flush: nothing to do
}

// Unwrap lets http.ResponseController (deadlines, hijacking) reach the
// connection.
func (sw *settleWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// cost is what the handler reported, or estimate: the header's value as
// the header was written; else, once the handler has returned (returned
// is false after a panic), the value it holds then (a header set but not
// yet written, or a trailer, declared or with http.TrailerPrefix). A
// malformed value is estimate; edge.Core.Settle caps a huge one.
func (sw *settleWriter) cost(estimate int64, returned bool) int64 {
	v := sw.value
	if v == "" && returned {
		h := sw.Header()
		v = cmp.Or(h.Get(sw.name), h.Get(http.TrailerPrefix+sw.name))
	}
	if used, ok := edge.ParseCost(v); ok {
		return used
	}
	return estimate
}
