package server

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/envoy/rules"
)

// envoyMark is what the dashboard says of an Envoy rule's policy beside
// its numbers, so they are not misread (uiPolicy's fields of the same
// names).
type envoyMark struct {
	window     string // "week (7 days, fixed)"; "" for the policy's own window text
	shadow     bool
	quotaMode  bool
	replaces   []string
	replacedBy []string
}

// envoyMarks returns the marks of the rules files' policies, by policy
// ID; nil without rules files. A replaces entry names a rule of its
// domain by rate_limit.name; the marks name the policies (the dashboard's
// rows) instead, leaving out rules without one (unlimited, 0 per unit).
func (s *Server) envoyMarks() map[string]*envoyMark {
	if s.envoyState == nil || s.envoyState.Rules == nil {
		return nil
	}
	all := s.envoyState.Rules.Rules()
	marks := map[string]*envoyMark{}
	named := map[[2]string][]string{} // domain and name → policy IDs
	for _, r := range all {
		if !r.Decided() {
			continue
		}
		m := &envoyMark{shadow: r.Shadow, quotaMode: r.QuotaMode}
		switch r.Unit {
		case rules.Week, rules.Month, rules.Year:
			// envoyproxy/ratelimit's dividers: fixed lengths, not calendar periods.
			m.window = fmt.Sprintf("%s (%d days, fixed)", r.Unit, r.UnitLength/(24*time.Hour))
		}
		marks[r.Policy.ID] = m
		if r.Name != "" {
			k := [2]string{r.Domain, r.Name}
			named[k] = append(named[k], r.Policy.ID)
		}
	}
	for _, r := range all {
		m := marks[r.Policy.ID]
		if m == nil {
			continue
		}
		for _, name := range r.Replaces {
			for _, id := range named[[2]string{r.Domain, name}] {
				m.replaces = append(m.replaces, id)
				marks[id].replacedBy = append(marks[id].replacedBy, r.Policy.ID)
			}
		}
	}
	return marks
}

// mark sets p's marks from m, when p is an Envoy rule's policy.
func (p *uiPolicy) mark(m *envoyMark) {
	if m == nil {
		return
	}
	if m.window != "" {
		p.Window = m.window
	}
	p.Shadow, p.QuotaMode, p.Replaces, p.ReplacedBy = m.shadow, m.quotaMode, m.replaces, m.replacedBy
}
