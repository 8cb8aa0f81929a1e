package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/overridemap"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/internal/wiring"
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
	in, t, ok := s.readOverride(w, r)
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
	if t.rlqs {
		if why := s.rlqsBurstShort(t.policy, in.Limit, in.Burst, window); why != "" {
			s.overrideAnswer(w, http.StatusUnprocessableEntity, nil, why)
			return
		}
	}
	o := sluice.Override{Policy: t.policy, Subject: t.subject, Limit: in.Limit, Burst: in.Burst, Window: window, Note: in.Note}
	if s.dropOlder(w, r, t) {
		s.setOverride(w, r, t.lim, o)
	}
}

// dropOlder removes the overrides of t's subject under older HMAC keys
// (during a key rotation the Limiter applies them while the subject's
// current pseudonym has none), so a plan set or removed now is the only
// one. It answers and reports false when the store fails.
func (s *Server) dropOlder(w http.ResponseWriter, r *http.Request, t overrideTarget) bool {
	if _, ok := t.lim.Policy(t.policy); !ok {
		return true // setOverride answers the unknown policy
	}
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	for _, old := range t.previous {
		if err := t.lim.SetOverride(ctx, sluice.Override{Policy: t.policy, Subject: old}); err != nil {
			s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
			return false
		}
	}
	return true
}

func (s *Server) deleteOverride(w http.ResponseWriter, r *http.Request) {
	in, t, ok := s.readOverride(w, r)
	if !ok {
		return
	}
	if in.Limit != 0 || in.Burst != 0 || in.Window != "" || in.Note != "" {
		s.overrideAnswer(w, http.StatusBadRequest, nil, "DELETE takes policy and subject (or envoy, proxy or rlqs) only")
		return
	}
	o := sluice.Override{Policy: t.policy, Subject: t.subject}
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
	if !s.dropOlder(w, r, t) {
		return
	}
	if cfg == nil {
		s.setOverride(w, r, t.lim, o)
		return
	}
	// The API's over the file's: removed, the file's applies again.
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	if err := t.lim.SetOverride(ctx, o); err != nil {
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
	list, err := s.allOverrides(ctx)
	for _, l := range list {
		if l.Policy == o.Policy && l.Subject == o.Subject {
			inForce = l
		}
	}
	return cfg, inForce, err
}

// setOverride puts o to lim and answers with its entry.
func (s *Server) setOverride(w http.ResponseWriter, r *http.Request, lim *sluice.Limiter, o sluice.Override) {
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	err := lim.SetOverride(ctx, o)
	var pe *policyerr.Error
	var full *overridemap.Full
	switch {
	case errors.As(err, &full):
		// The store counts them, in the write (wiring bounds it).
		s.overrideAnswer(w, http.StatusConflict, nil, fmt.Sprintf("%d overrides are set: at most %d; remove one (DELETE) before adding another", full.Stored, full.Max))
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
	list, err := s.allOverrides(ctx)
	if err != nil {
		s.overrideAnswer(w, http.StatusServiceUnavailable, nil, err.Error())
		return
	}
	policy := r.URL.Query().Get("policy")
	_, lookup := s.shown()
	if _, ok := lookup(policy); policy != "" && !ok {
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

// overrideTarget is what an admin write names, resolved: the Limiter
// that has the policy, the policy, the subject's pseudonym as the edge
// that checks it makes it, and its pseudonyms under older keys; rlqs
// when it names a bucket of Envoy's quota service, whose plan's burst
// must cover its rate per second.
type overrideTarget struct {
	lim             *sluice.Limiter
	policy, subject string
	previous        []string
	rlqs            bool
}

// readOverride authorizes an admin write, decodes its body and resolves
// what it names (see target).
func (s *Server) readOverride(w http.ResponseWriter, r *http.Request) (checkapi.OverrideRequest, overrideTarget, bool) {
	var in checkapi.OverrideRequest
	if s.auth == nil {
		s.overrideAnswer(w, http.StatusForbidden, nil, "no tokens are configured: changing overrides needs a token with the admin scope (server.auth.tokens)")
		return in, overrideTarget{}, false
	}
	if s.lim == nil {
		s.overrideAnswer(w, http.StatusNotFound, nil, errNoPolicies.Error())
		return in, overrideTarget{}, false
	}
	if why := s.decode(w, r, &in); why != "" { // one JSON object, nothing after it: the check API's rule
		s.overrideAnswer(w, http.StatusBadRequest, nil, why)
		return in, overrideTarget{}, false
	}
	if len(in.Note) > 200 {
		s.overrideAnswer(w, http.StatusBadRequest, nil, fmt.Sprintf("note is %d bytes: must be at most 200", len(in.Note)))
		return in, overrideTarget{}, false
	}
	t, code, why := s.target(in)
	if why != "" {
		s.overrideAnswer(w, code, nil, why)
		return in, overrideTarget{}, false
	}
	return in, t, true
}

// target resolves what in names: a check API subject (subject, raw,
// pseudonymized as /v1/check does) of the check API's policy, or a
// descriptor as the Envoy service sees it (envoy), whose rule gives the
// policy; or a proxy's client or a quota service's bucket (proxyTarget,
// rlqsTarget). On failure it returns the status and the reason.
func (s *Server) target(in checkapi.OverrideRequest) (overrideTarget, int, string) {
	if in.RLQS != nil {
		return s.rlqsTarget(in)
	}
	if in.Proxy != nil {
		return s.proxyTarget(in)
	}
	if in.Envoy == nil {
		switch {
		case in.Policy == "":
			return overrideTarget{}, http.StatusBadRequest, "policy is required"
		case in.Subject == "" || len(in.Subject) > checkapi.MaxSubjectLen:
			return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("subject is %d bytes: must be 1 to %d", len(in.Subject), checkapi.MaxSubjectLen)
		}
		return overrideTarget{lim: s.lim, policy: in.Policy, subject: s.pseud.Pseudonym("api", in.Subject, ""), previous: s.pseud.Previous("api", in.Subject, "")}, 0, ""
	}
	if in.Subject != "" {
		return overrideTarget{}, http.StatusBadRequest, "set subject or envoy, not both"
	}
	if s.envoyState == nil {
		return overrideTarget{}, http.StatusNotFound, "envoy: this server has no Envoy rules (envoy: configs)"
	}
	d := in.Envoy
	if len(d.Entries) == 0 || len(d.Entries) > rls.DefaultMaxEntries || len(d.Domain) > checkapi.MaxSubjectLen {
		return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("envoy: a domain of at most %d bytes and 1 to %d entries", checkapi.MaxSubjectLen, rls.DefaultMaxEntries)
	}
	entries := make([]rules.Entry, len(d.Entries))
	for i, e := range d.Entries {
		entries[i] = rules.Entry{Key: e.Key, Value: e.Value}
	}
	policy, subj, prev, err := s.envoyState.OverrideSubject(d.Domain, entries)
	switch {
	case err != nil:
		return overrideTarget{}, http.StatusNotFound, "envoy: " + err.Error()
	case in.Policy != "" && in.Policy != policy:
		return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("policy %q: the descriptor's rule has policy %q; leave policy out or name that one", in.Policy, policy)
	}
	t := overrideTarget{lim: s.lim, policy: policy, subject: subj, previous: prev}
	if s.envoy != nil {
		t.lim = s.envoy
	}
	return t, 0, ""
}

// overrideEntry is o as lists show it: without its subject.
func (s *Server) overrideEntry(o sluice.Override) checkapi.OverrideEntry {
	e := checkapi.OverrideEntry{Policy: o.Policy, Note: o.Note, Limit: o.Limit, Burst: o.Burst, Source: "api"}
	_, lookup := s.shown()
	p, _ := lookup(o.Policy)
	if e.Burst == 0 {
		e.Burst = o.Limit
		if p.Algorithm == sluice.Concurrency {
			e.Burst = 0
		}
	}
	switch w := o.Window; {
	case p.Algorithm == sluice.Concurrency:
	case w == 0:
		e.Window = windowText(&p)
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
	list, err := s.allOverrides(ctx)
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

// proxyTarget resolves an override naming a client of the proxy (see
// wiring.ProxySubject): 422 for a client the proxy refuses every request
// of, whose plan could never apply.
func (s *Server) proxyTarget(in checkapi.OverrideRequest) (overrideTarget, int, string) {
	switch {
	case in.Subject != "" || in.Envoy != nil:
		return overrideTarget{}, http.StatusBadRequest, "set one of subject, envoy, proxy and rlqs"
	case s.proxySubject == nil:
		return overrideTarget{}, http.StatusNotFound, "proxy: this server has no reverse proxy (proxy:)"
	case len(in.Proxy.IP)+len(in.Proxy.Header) > checkapi.MaxSubjectLen:
		return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("proxy: ip or header of at most %d bytes", checkapi.MaxSubjectLen)
	}
	policies, subj, prev, err := s.proxySubject(in.Proxy.Route, in.Proxy.IP, in.Proxy.Header)
	switch {
	case errors.Is(err, wiring.ErrEdgeRefuses):
		return overrideTarget{}, http.StatusUnprocessableEntity, err.Error()
	case err != nil: // it names its field, never the client
		return overrideTarget{}, http.StatusBadRequest, err.Error()
	}
	policy := in.Policy
	switch {
	case policy == "" && len(policies) == 1:
		policy = policies[0]
	case !slices.Contains(policies, policy):
		return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("policy %q: must be one of the route's policies %q", policy, policies)
	}
	return overrideTarget{lim: s.lim, policy: policy, subject: subj, previous: prev}, 0, ""
}

// allOverrides lists the overrides of the check API's Limiter and of the
// Envoy rules' (when it is another), each policy and subject once.
func (s *Server) allOverrides(ctx context.Context) ([]sluice.Override, error) {
	list, err := s.lim.Overrides(ctx)
	if err != nil || s.envoy == nil {
		return list, err
	}
	more, err := s.envoy.Overrides(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range more {
		if !slices.ContainsFunc(list, func(l sluice.Override) bool { return l.Policy == o.Policy && l.Subject == o.Subject }) {
			list = append(list, o)
		}
	}
	return list, nil
}
