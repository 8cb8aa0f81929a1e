package server

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/simulate"
)

// The dashboard: GET /ui serves one page whose script and style are
// embedded in the binary (no external asset, so it works offline), and
// which reads two JSON endpoints:
//
//   - GET /ui/api/state: the policies and their numbers, decisions per
//     second per policy and outcome over the last LiveSeconds (from
//     Metrics), the store's health (readiness, how long the readiness
//     checks took, the circuit breaker's state), the config generation,
//     and per policy what settles of estimates charged, gave back and
//     left owed (sluice_settled_units_total); per proxy route what its
//     max_delay queue held, how long on average, and what it dropped;
//     per policy the waits bookings were told; per policy with priority
//     classes, each class's share and decisions (ui_waits.go).
//   - POST /ui/api/simulate: the playground, which runs internal/simulate
//     on numbers and a pattern the page sends, within PlaygroundMax*
//     bounds, and answers the chart as SVG with the measures.
//
// Nothing it serves names a subject, not even a pseudonym. With
// Options.Tokens, every /ui path requires a token with the admin scope,
// as "Authorization: Bearer <token>" or as the password of HTTP basic
// authentication (which a browser asks for).

//go:embed ui/index.html ui/app.js ui/app.css
var uiFiles embed.FS

// Bounds of one playground run.
const (
	PlaygroundMaxRequests = 20_000
	PlaygroundMaxWindows  = 100
	playgroundMaxBody     = 4 << 10
	playgroundConcurrent  = 2
)

// StoreInfo describes the store to the dashboard. The zero value shows
// an unnamed store without a breaker.
type StoreInfo struct {
	// Type names the store: "memory" or "redis".
	Type string
	// Breaker, when set, returns the state of the store's circuit breaker:
	// "closed", "open" or "half_open". Default: nil, no breaker.
	Breaker func() string
	// Batches reports that the store shares round trips between
	// concurrent decisions (redisstore): the checks of one POST
	// /v1/checks are then decided at once, so that they reach it
	// together. Default: false, a store that decides in process
	// (memstore), the checks decided one after another in order.
	Batches bool
}

// uiSecurityHeaders keep the page to its own origin: it loads nothing
// and talks to nothing else.
func uiSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// admin wraps a /ui handler with the admin-scope check when tokens are
// configured.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		uiSecurityHeaders(w.Header())
		if s.auth != nil {
			lw, _ := w.(*logWriter)
			tok, err := s.auth.authenticateUI(r)
			if err != nil {
				if lw != nil {
					lw.reason = err.Error()
				}
				w.Header().Set("WWW-Authenticate", `Basic realm="sluice dashboard", charset="UTF-8"`)
				http.Error(w, "a token with the admin scope is required: send it as Authorization: Bearer <token>, or as the password of HTTP basic authentication", http.StatusUnauthorized)
				return
			}
			if lw != nil {
				lw.token = tok.id
			}
			if !slices.Contains(tok.scopes, config.ScopeAdmin) {
				if lw != nil {
					lw.reason = "token lacks scope " + config.ScopeAdmin
				}
				http.Error(w, fmt.Sprintf("token %q lacks scope %s", tok.id, config.ScopeAdmin), http.StatusForbidden)
				return
			}
		}
		h(w, r)
	}
}

// authenticateUI accepts the token as a bearer token or as the password
// of basic authentication, the one a browser can send by itself.
func (a *auth) authenticateUI(r *http.Request) (*authToken, error) {
	if _, password, ok := r.BasicAuth(); ok {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+password)
	}
	return a.authenticate(r.Header.Get("Authorization"))
}

func (s *Server) uiPage(w http.ResponseWriter, r *http.Request) {
	s.uiFile(w, "ui/index.html", "text/html; charset=utf-8")
}

func (s *Server) uiAsset(w http.ResponseWriter, r *http.Request) {
	switch r.PathValue("file") {
	case "app.js":
		s.uiFile(w, "ui/app.js", "text/javascript; charset=utf-8")
	case "app.css":
		s.uiFile(w, "ui/app.css", "text/css; charset=utf-8")
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) uiFile(w http.ResponseWriter, name, contentType string) {
	b, err := uiFiles.ReadFile(name)
	if err != nil { // embedded at build time: cannot happen
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Write(b)
}

// uiState is the answer of GET /ui/api/state.
type uiState struct {
	// Now is the Unix second the live series end at (the current one,
	// still counting).
	Now         int64         `json:"now"`
	LiveSeconds int           `json:"live_seconds"`
	Config      *ConfigStatus `json:"config,omitempty"`
	Store       uiStore       `json:"store"`
	Policies    []uiPolicy    `json:"policies"`
	// Overrides are the tenant plans, by note, never by subject; nil when
	// the store could not be read.
	Overrides []checkapi.OverrideEntry `json:"overrides"`
	// Live is nil when the server counts no metrics.
	Live []LiveSeries `json:"live"`
	// Settles is what settles of estimates did per policy (charged,
	// given back, owed, from sluice_settled_units_total); nil when the
	// server counts no metrics.
	Settles []uiSettled `json:"settles"`
	// Queues, Bookings and Priorities are the Queues, Waits booked and
	// Priorities tables (ui_waits.go); nil when the server counts no
	// metrics.
	Queues     []uiQueue    `json:"queues"`
	Bookings   []uiBooked   `json:"bookings"`
	Priorities []uiPriority `json:"priorities"`
	// RLQS is the Envoy quota buckets table, GET /v1/rlqs's first
	// uiRLQSLimit buckets; nil without envoy.rlqs.
	RLQS []checkapi.RLQSBucketView `json:"rlqs"`
}

// uiRLQSLimit is how many quota service buckets the dashboard shows.
const uiRLQSLimit = 100

type uiStore struct {
	Type  string `json:"type"`
	Ready bool   `json:"ready"`
	Error string `json:"error,omitempty"`
	// LatencyMS is how long the readiness checks took (a round trip to
	// Redis); absent when the store has none.
	LatencyMS *float64 `json:"latency_ms,omitempty"`
	Breaker   string   `json:"breaker,omitempty"`
}

type uiPolicy struct {
	ID          string `json:"id"`
	Algorithm   string `json:"algorithm"`
	Limit       int64  `json:"limit"`
	Window      string `json:"window"`
	Burst       int64  `json:"burst,omitempty"`
	MaxCost     int64  `json:"max_cost"`
	FailureMode string `json:"failure_mode"`
	Revision    int64  `json:"revision"`
	Approximate bool   `json:"approximate"`
	NearCache   bool   `json:"near_cache"`
	// Priorities are the policy's priority classes and their shares in
	// percent (sluice.Policy.Priorities), e.g. {"sheddable": 50}.
	Priorities map[string]int `json:"priorities,omitempty"`
	// Shadow, QuotaMode, Replaces and ReplacedBy mark an Envoy rule's
	// policy (ui_envoy.go): shadow_mode (its denials were answered OK),
	// quota_mode, the policies of the rules it replaces and of those
	// replacing it when both apply. An Envoy rule's week, month or year
	// window reads e.g. "week (7 days, fixed)".
	Shadow     bool     `json:"shadow,omitempty"`
	QuotaMode  bool     `json:"quota_mode,omitempty"`
	Replaces   []string `json:"replaces,omitempty"`
	ReplacedBy []string `json:"replaced_by,omitempty"`
}

func (s *Server) uiState(w http.ResponseWriter, r *http.Request) {
	st := uiState{Now: s.clock.Now().Unix(), LiveSeconds: LiveSeconds, Store: uiStore{Type: s.store.Type, Ready: true}}
	if s.configStatus != nil {
		cs := s.configStatus()
		st.Config = &cs
	}
	if s.store.Breaker != nil {
		st.Store.Breaker = s.store.Breaker()
	}
	if len(s.ready) > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), s.readyTTL)
		start := s.clock.Now()
		for _, check := range s.ready {
			if err := check(ctx); err != nil {
				st.Store.Ready, st.Store.Error = false, err.Error()
				break
			}
		}
		ms := float64(s.clock.Now().Sub(start).Microseconds()) / 1000
		st.Store.LatencyMS = &ms
		cancel()
	}
	ids, policy := s.shown()
	marks := s.envoyMarks()
	for _, id := range ids {
		p, _ := policy(id)
		up := uiPolicy{ID: id, Algorithm: p.Algorithm.String(), Limit: p.Limit, Window: windowText(&p), MaxCost: p.MaxCost,
			FailureMode: s.modes[id].String(), Revision: p.Revision, Approximate: p.Algorithm == sluice.SlidingWindow, NearCache: p.NearCache,
			Priorities: p.Priorities}
		if p.Algorithm == sluice.TokenBucket || p.Algorithm == sluice.GCRA {
			up.Burst = p.Burst
		}
		if _, own := s.policy(id); !own || s.envoy == nil { // a config policy of the Envoy rules' ID is shown, not the rule
			up.mark(marks[id])
		}
		st.Policies = append(st.Policies, up)
	}
	if s.lim != nil {
		ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
		if list, err := s.lim.Overrides(ctx); err == nil {
			st.Overrides = []checkapi.OverrideEntry{}
			for _, o := range list {
				st.Overrides = append(st.Overrides, s.overrideEntry(o))
			}
		}
		cancel()
	}
	if s.metrics != nil {
		st.Live = s.metrics.live.series(ids, st.Now)
		st.Settles = s.metrics.settledTotals(ids)
		st.Queues = s.metrics.queueTotals()
		st.Bookings = s.metrics.bookedTotals(ids)
		st.Priorities = s.metrics.priorityTotals(ids, policy)
	}
	st.RLQS = s.rlqsViews(uiRLQSLimit)
	writeJSON(w, http.StatusOK, st)
}

// simRequest is the body of POST /ui/api/simulate.
type simRequest struct {
	Algorithm string  `json:"algorithm"` // one of the five, or "all"
	Limit     int64   `json:"limit"`
	Window    string  `json:"window"` // a Go duration, e.g. "10s"
	Burst     int64   `json:"burst"`  // token_bucket and gcra; 0: the limit
	Pattern   string  `json:"pattern"`
	Rate      float64 `json:"rate"`     // requests per second; 0: the pattern's default
	Duration  string  `json:"duration"` // a Go duration; "": the pattern's default
	Seed      uint64  `json:"seed"`
}

// simResult is one policy's measures in the playground's answer.
type simResult struct {
	Algorithm     string  `json:"algorithm"`
	Offered       int     `json:"offered"`
	Admitted      int     `json:"admitted"`
	MaxInWindow   int     `json:"max_in_window"`
	MaxRatio      float64 `json:"max_ratio"`
	FalseAdmitPct float64 `json:"false_admit_pct"`
	FalseDenyPct  float64 `json:"false_deny_pct"`
}

func (s *Server) uiSimulate(w http.ResponseWriter, r *http.Request) {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		writeJSON(w, http.StatusUnsupportedMediaType, map[string]string{"error": "Content-Type must be application/json"})
		return
	}
	select {
	case s.sims <- struct{}{}:
		defer func() { <-s.sims }()
	default:
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the playground is busy with other runs: try again in a second"})
		return
	}
	var in simRequest
	if msg := decodeBody(w, r, playgroundMaxBody, &in); msg != "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
		return
	}
	spec, title, err := in.spec()
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	res, err := simulate.Run(spec)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	var svg bytes.Buffer
	if err := simulate.SVG(&svg, res, title); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	out := struct {
		SVG     string      `json:"svg"`
		Results []simResult `json:"results"`
	}{SVG: svg.String()}
	for i := range res.Results {
		pr := &res.Results[i]
		out.Results = append(out.Results, simResult{Algorithm: pr.Policy.Name, Offered: pr.Offered, Admitted: pr.Allowed,
			MaxInWindow: pr.MaxInWindow, MaxRatio: pr.MaxRatio(), FalseAdmitPct: pr.FalseAdmitPct(), FalseDenyPct: pr.FalseDenialPct()})
	}
	writeJSON(w, http.StatusOK, out)
}

// spec checks in and returns the simulation it asks for, or an error
// naming the field, the value and the rule.
func (in *simRequest) spec() (simulate.Spec, string, error) {
	bad := func(field, value, rule string) error { return fmt.Errorf("%s = %s: %s", field, value, rule) }
	window, err := time.ParseDuration(in.Window)
	if err != nil || window <= 0 || window%time.Microsecond != 0 {
		return simulate.Spec{}, "", bad("window", strconv.Quote(in.Window), "must be a positive duration of whole microseconds, e.g. 10s or 1m")
	}
	w := window.Microseconds()
	var policies []simulate.Policy
	if in.Algorithm == "all" {
		policies = simulate.Compare(in.Limit, w, in.Burst)
	} else {
		kind, err := simulate.ParseKind(in.Algorithm)
		if err != nil {
			return simulate.Spec{}, "", bad("algorithm", strconv.Quote(in.Algorithm), "must be one of all, fixed_window, sliding_log, sliding_window, token_bucket, gcra")
		}
		burst := in.Burst
		if burst == 0 || kind != algorithm.KindTokenBucket && kind != algorithm.KindGCRA {
			if in.Burst != 0 && in.Burst != in.Limit {
				return simulate.Spec{}, "", bad("burst", fmt.Sprint(in.Burst), "applies only to token_bucket and gcra")
			}
			burst = in.Limit
		}
		policies = []simulate.Policy{{Name: in.Algorithm, Kind: kind, Params: algorithm.Params{Limit: in.Limit, Window: w, Burst: burst}}}
	}
	for _, p := range policies {
		if err := p.Params.Check(p.Kind); err != nil {
			var re *algorithm.RangeError
			if errors.As(err, &re) {
				value := fmt.Sprint(re.Value)
				if re.Field == "window" {
					value = window.String()
				}
				return simulate.Spec{}, "", bad(re.Field, value, re.Rule)
			}
			return simulate.Spec{}, "", err
		}
	}
	ps := simulate.PatternSpec{Name: in.Pattern, Rate: in.Rate, Seed: in.Seed, MaxRequests: PlaygroundMaxRequests}
	if in.Duration != "" {
		d, err := time.ParseDuration(in.Duration)
		if err != nil || d < window || d > PlaygroundMaxWindows*window {
			return simulate.Spec{}, "", bad("duration", strconv.Quote(in.Duration), fmt.Sprintf("must be a duration between one window and %d windows", PlaygroundMaxWindows))
		}
		ps.Duration = d.Microseconds()
	}
	if in.Rate < 0 {
		return simulate.Spec{}, "", bad("rate", fmt.Sprint(in.Rate), "must be a positive number of requests per second, or 0 for the pattern's default")
	}
	arrivals, start, end, err := simulate.Generate(ps, in.Limit, w)
	if err != nil {
		return simulate.Spec{}, "", err
	}
	title := fmt.Sprintf("%s: %d requests over %v", in.Pattern, len(arrivals), time.Duration(end-start)*time.Microsecond)
	return simulate.Spec{Start: start, End: end, Arrivals: arrivals, Policies: policies}, title, nil
}

// writeJSON answers v as JSON with code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// windowText is what the dashboard and the overrides list show as p's
// window: its duration, or a calendar period and its zone, e.g. "month
// (Europe/Berlin)".
func windowText(p *sluice.Policy) string {
	if p.Period == "" {
		return p.Window.String()
	}
	zone := "UTC"
	if p.TimeZone != nil {
		zone = p.TimeZone.String()
	}
	return p.Period + " (" + zone + ")"
}
