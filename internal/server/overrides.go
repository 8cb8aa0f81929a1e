package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/policyerr"
)

// The admin API of runtime overrides (PUT, GET, DELETE /v1/overrides),
// under a token with the admin scope. A subject is pseudonymized as a
// check's is before it reaches the Limiter; no answer, log line or
// metric shows it or its pseudonym: lists show the note. Without tokens
// configured, PUT and DELETE are refused (an open server would let
// anyone raise their own limit) and GET is open, as the dashboard is.

// overrideTimeout bounds one admin call to the store.
const overrideTimeout = 2 * time.Second

func (s *Server) putOverride(w http.ResponseWriter, r *http.Request) {
	in, ok := s.readOverride(w, r)
	if !ok {
		return
	}
	if in.Limit < 1 {
		s.overrideAnswer(w, http.StatusBadRequest, nil, fmt.Sprintf("limit = %d: must be at least 1 (DELETE removes an override)", in.Limit))
		return
	}
	var window time.Duration
	if in.Window != "" {
		d, err := time.ParseDuration(in.Window)
		if err != nil {
			s.overrideAnswer(w, http.StatusBadRequest, nil, fmt.Sprintf("window = %q: must be a duration such as 10s, 1m or 1h30m", in.Window))
			return
		}
		window = d
	}
	o := sluice.Override{Policy: in.Policy, Subject: s.pseud.Pseudonym("api", in.Subject, ""), Limit: in.Limit, Burst: in.Burst, Window: window, Note: in.Note}
	if s.underCap(w, r, o) && s.dropOlder(w, r, in) {
		s.setOverride(w, r, o)
	}
}

// maxOverrides bounds the overrides (the config file's included) a PUT
// may add to: each change rebuilds every Limiter's snapshot of them (5ms
// at 10 000), and every server holds them all in memory.
const maxOverrides = 10000

// underCap reports whether o may be set: it replaces one, or fewer than
// s.maxOverrides are set. It answers when not.
func (s *Server) underCap(w http.ResponseWriter, r *http.Request, o sluice.Override) bool {
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	list, err := s.lim.Overrides(ctx)
	if err != nil {
		s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
		return false
	}
	for _, l := range list {
		if l.Policy == o.Policy && l.Subject == o.Subject {
			return true
		}
	}
	if len(list) >= s.maxOverrides {
		s.overrideAnswer(w, http.StatusConflict, nil, fmt.Sprintf("%d overrides are set: at most %d; remove one (DELETE) before adding another", len(list), s.maxOverrides))
		return false
	}
	return true
}

// dropOlder removes the overrides of in's subject under older HMAC keys
// (during a key rotation the Limiter applies them while the subject's
// current pseudonym has none), so a plan set or removed now is the only
// one. It answers and reports false when the store fails.
func (s *Server) dropOlder(w http.ResponseWriter, r *http.Request, in checkapi.OverrideRequest) bool {
	if _, ok := s.policy(in.Policy); !ok {
		return true // setOverride answers the unknown policy
	}
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	for _, old := range s.pseud.Previous("api", in.Subject, "") {
		if err := s.lim.SetOverride(ctx, sluice.Override{Policy: in.Policy, Subject: old}); err != nil {
			s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
			return false
		}
	}
	return true
}

func (s *Server) deleteOverride(w http.ResponseWriter, r *http.Request) {
	in, ok := s.readOverride(w, r)
	if !ok {
		return
	}
	if in.Limit != 0 || in.Burst != 0 || in.Window != "" || in.Note != "" {
		s.overrideAnswer(w, http.StatusBadRequest, nil, "DELETE takes policy and subject only")
		return
	}
	o := sluice.Override{Policy: in.Policy, Subject: s.pseud.Pseudonym("api", in.Subject, "")}
	cfg, inForce, err := s.overrideInForce(r.Context(), o)
	if err != nil {
		s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
		return
	}
	if cfg != nil && inForce == *cfg {
		// Only the file's is left: the Limiter would apply it again under
		// whatever it removes.
		s.overrideAnswer(w, http.StatusConflict, nil, "this override is set in the config file (overrides:): remove it there")
		return
	}
	if !s.dropOlder(w, r, in) {
		return
	}
	if cfg == nil {
		s.setOverride(w, r, o)
		return
	}
	// The API's over the file's: removed, the file's applies again.
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	if err := s.lim.SetOverride(ctx, o); err != nil {
		s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
		return
	}
	s.overrideAnswer(w, http.StatusOK, []checkapi.OverrideEntry{s.overrideEntry(*cfg)}, "")
}

// overrideInForce returns the config file's override of o's policy and
// subject (nil when the file has none) and the one the Limiter applies
// (the zero Override when none).
func (s *Server) overrideInForce(ctx context.Context, o sluice.Override) (cfg *sluice.Override, inForce sluice.Override, err error) {
	for i, c := range s.cfgOverrides {
		if c.Policy == o.Policy && c.Subject == o.Subject {
			cfg = &s.cfgOverrides[i]
		}
	}
	if cfg == nil {
		return nil, inForce, nil
	}
	ctx, cancel := context.WithTimeout(ctx, overrideTimeout)
	defer cancel()
	list, err := s.lim.Overrides(ctx)
	for _, l := range list {
		if l.Policy == o.Policy && l.Subject == o.Subject {
			inForce = l
		}
	}
	return cfg, inForce, err
}

// setOverride puts o to the Limiter and answers with its entry.
func (s *Server) setOverride(w http.ResponseWriter, r *http.Request, o sluice.Override) {
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	err := s.lim.SetOverride(ctx, o)
	var pe *policyerr.Error
	switch {
	case errors.Is(err, policyerr.ErrUnknownPolicy):
		s.overrideAnswer(w, http.StatusNotFound, nil, err.Error())
	case errors.As(err, &pe), errors.Is(err, sluice.ErrInvalidRequest):
		s.overrideAnswer(w, http.StatusUnprocessableEntity, nil, err.Error())
	case err != nil:
		s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
	default:
		var entries []checkapi.OverrideEntry
		if o.Limit != 0 {
			entries = append(entries, s.overrideEntry(o))
		}
		s.overrideAnswer(w, http.StatusOK, entries, "")
	}
}

func (s *Server) listOverrides(w http.ResponseWriter, r *http.Request) {
	if s.lim == nil {
		s.overrideAnswer(w, http.StatusOK, nil, "")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	list, err := s.lim.Overrides(ctx)
	if err != nil {
		s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
		return
	}
	policy := r.URL.Query().Get("policy")
	if _, ok := s.policy(policy); policy != "" && !ok {
		s.overrideAnswer(w, http.StatusNotFound, nil, fmt.Sprintf("policy %q: %v", policy, policyerr.ErrUnknownPolicy))
		return
	}
	entries := []checkapi.OverrideEntry{}
	for _, o := range list {
		if policy == "" || o.Policy == policy {
			entries = append(entries, s.overrideEntry(o))
		}
	}
	s.overrideAnswer(w, http.StatusOK, entries, "")
}

// readOverride authorizes an admin write and decodes its body.
func (s *Server) readOverride(w http.ResponseWriter, r *http.Request) (checkapi.OverrideRequest, bool) {
	var in checkapi.OverrideRequest
	if s.auth == nil {
		s.overrideAnswer(w, http.StatusForbidden, nil, "no tokens are configured: changing overrides needs a token with the admin scope (server.auth.tokens)")
		return in, false
	}
	if s.lim == nil {
		s.overrideAnswer(w, http.StatusNotFound, nil, errNoPolicies.Error())
		return in, false
	}
	if why := s.decode(w, r, &in); why != "" { // one JSON object, nothing after it: the check API's rule
		s.overrideAnswer(w, http.StatusBadRequest, nil, why)
		return in, false
	}
	switch {
	case in.Policy == "":
		s.overrideAnswer(w, http.StatusBadRequest, nil, "policy is required")
		return in, false
	case in.Subject == "" || len(in.Subject) > checkapi.MaxSubjectLen:
		s.overrideAnswer(w, http.StatusBadRequest, nil, fmt.Sprintf("subject is %d bytes: must be 1 to %d", len(in.Subject), checkapi.MaxSubjectLen))
		return in, false
	case len(in.Note) > 200:
		s.overrideAnswer(w, http.StatusBadRequest, nil, fmt.Sprintf("note is %d bytes: must be at most 200", len(in.Note)))
		return in, false
	}
	return in, true
}

// overrideEntry is o as lists show it: without its subject.
func (s *Server) overrideEntry(o sluice.Override) checkapi.OverrideEntry {
	e := checkapi.OverrideEntry{Policy: o.Policy, Note: o.Note, Limit: o.Limit, Burst: o.Burst, Source: "api"}
	p, _ := s.policy(o.Policy)
	if e.Burst == 0 {
		e.Burst = o.Limit
		if p.Algorithm == sluice.Concurrency {
			e.Burst = 0
		}
	}
	switch w := o.Window; {
	case p.Algorithm == sluice.Concurrency:
	case w == 0:
		e.Window = p.Window.String()
	default:
		e.Window = w.String()
	}
	for _, c := range s.cfgOverrides {
		if c == o {
			e.Source = "config"
		}
	}
	return e
}

func (s *Server) overrideAnswer(w http.ResponseWriter, code int, entries []checkapi.OverrideEntry, why string) {
	if lw, ok := w.(*logWriter); ok && why != "" {
		lw.reason = why
	}
	if entries == nil {
		entries = []checkapi.OverrideEntry{}
	}
	b, _ := json.Marshal(checkapi.OverrideList{Overrides: entries, Error: why})
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// overrideCounts returns how many overrides each policy has (every
// policy named, zeros included), or nil when they cannot be read.
func (s *Server) overrideCounts(ctx context.Context) map[string]int {
	if s.lim == nil {
		return map[string]int{}
	}
	list, err := s.lim.Overrides(ctx)
	if err != nil {
		return nil
	}
	n := make(map[string]int, len(s.policies()))
	for _, id := range s.policies() {
		n[id] = 0
	}
	for _, o := range list {
		n[o.Policy]++
	}
	return n
}
