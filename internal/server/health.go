package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/failure"
)

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeHealth(w, http.StatusOK, "ok\n")
}

// storeHealthPath answers whether the store can decide now: 200, or 503
// naming the failure. It is the store's health, for dashboards and
// alerts; readiness (GET /readyz) is the server's.
const storeHealthPath = "/readyz/store"

// readyz answers whether the server is worth sending requests to: 200
// when the store is healthy, and also while it is not but a policy is
// answered without it (failure_mode open or local, local quota), so a
// Kubernetes Service keeps the pods that still answer those policies;
// 503 when the store fails and every policy fails closed without it.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	err := s.storeErr(r)
	switch {
	case err == nil:
		writeHealth(w, http.StatusOK, "ok\n")
	case len(s.storeless) > 0:
		writeHealth(w, http.StatusOK, fmt.Sprintf("ok: the store is not ready (%v); policies answered without it: %s\n", err, strings.Join(s.storeless, ", ")))
	default:
		writeHealth(w, http.StatusServiceUnavailable, fmt.Sprintf("not ready: %v (every policy fails closed without the store)\n", err))
	}
}

// storeHealth answers GET /readyz/store: the store's own health.
func (s *Server) storeHealth(w http.ResponseWriter, r *http.Request) {
	if err := s.storeErr(r); err != nil {
		writeHealth(w, http.StatusServiceUnavailable, fmt.Sprintf("not ready: %v\n", err))
		return
	}
	writeHealth(w, http.StatusOK, "ok\n")
}

// storeErr runs the store's health checks: the first error, or nil. The
// request log gets the error as its reason.
func (s *Server) storeErr(r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.readyTTL)
	defer cancel()
	for _, check := range s.ready {
		if err := check(ctx); err != nil {
			return err
		}
	}
	return nil
}

// writeHealth writes a health check's plain-text answer.
func writeHealth(w http.ResponseWriter, code int, body string) {
	if lw, ok := w.(*logWriter); ok && code != http.StatusOK {
		lw.reason = strings.TrimSuffix(body, "\n")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	io.WriteString(w, body)
}

// answeredWithoutStore returns the IDs of the policies answered when the
// store cannot decide: those whose failure mode is open or local, and
// those with local quota (a block in hand keeps admitting).
func (s *Server) answeredWithoutStore() []string {
	ids, lookup := s.shown()
	var out []string
	for _, id := range ids {
		p, _ := lookup(id)
		if m := s.modes[id]; m == failure.Open || m == failure.Local || p.LocalQuota.Enabled {
			out = append(out, id)
		}
	}
	return out
}
