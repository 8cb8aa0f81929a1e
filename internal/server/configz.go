package server

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// ConfigStatus is the answer of GET /v1/config: which configuration is
// serving and how the last reload went.
type ConfigStatus struct {
	// Generation counts the configurations served since the start: 1 for
	// the one read at start, one more for each successful reload.
	Generation int64 `json:"generation"`
	// Hash is the SHA-256 (hex) of every file the configuration was read
	// from: the config file and the Envoy rules files.
	Hash string `json:"hash"`
	// LoadedAt is when this generation started serving.
	LoadedAt time.Time `json:"loaded_at"`
	// Files are the files read, config file first; empty for the
	// built-in example.
	Files []string `json:"files"`
	// LastReload is the last reload attempt; nil when there was none.
	LastReload *ReloadStatus `json:"last_reload,omitempty"`
	// Listen says where each service of the config listens, defaults
	// included.
	Listen []Listener `json:"listen"`
	// Overrides counts the overrides of each policy (config file's and
	// admin API's), e.g. {"api": 2}; absent when the store could not be
	// read.
	Overrides map[string]int `json:"overrides,omitempty"`
	// ConfigOverrides are the config file's overrides, by note (never
	// by subject).
	ConfigOverrides []OverrideNote `json:"config_overrides"`
}

// OverrideNote names one override without its subject.
type OverrideNote struct {
	Policy string `json:"policy"`
	Note   string `json:"note"`
}

// Listener is where one service listens, as the config says.
type Listener struct {
	Service string `json:"service"` // "check_api" (with /metrics and /ui), "proxy" or "envoy"
	Addr    string `json:"addr"`    // host:port as configured, e.g. "127.0.0.1:8080"
	// Source is the config field that set Addr, e.g. "server.listen", or
	// "default" when the file leaves it out (no server: section).
	Source string `json:"source"`
}

// ReloadStatus is one reload attempt.
type ReloadStatus struct {
	Result  string    `json:"result"`          // "success", "failure", or "unchanged" (the files are back to the serving config)
	Trigger string    `json:"trigger"`         // "signal" (SIGHUP) or "file" (a watched file changed)
	At      time.Time `json:"at"`              // when it was tried
	Error   string    `json:"error,omitempty"` // the line-numbered reason of a failure
}

func (s *Server) configz(w http.ResponseWriter, r *http.Request) {
	st := s.configStatus()
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	st.Overrides = s.overrideCounts(ctx)
	cancel()
	st.ConfigOverrides = []OverrideNote{}
	for _, o := range s.cfgOverrides {
		st.ConfigOverrides = append(st.ConfigOverrides, OverrideNote{Policy: o.Policy, Note: o.Note})
	}
	b, err := json.Marshal(st)
	if err != nil { // strings, ints and times only: cannot happen
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	w.Write(append(b, '\n'))
}
