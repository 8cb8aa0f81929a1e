package server

import (
	"sync"

	"github.com/sluicehq/sluice"
)

// LiveSeconds is how many seconds of decisions the dashboard shows.
const LiveSeconds = 300

// numKinds is the number of outcome kinds, sluice.Allowed to
// sluice.Indeterminate.
const numKinds = int(sluice.Indeterminate)

// live counts decisions per second, per policy and outcome, over the last
// LiveSeconds: one fixed ring of slots per policy, so its memory is
// bounded by the policies configured (and the "(unknown)" label). It is
// fed where Metrics counts sluice_decisions_total. Safe for concurrent
// use.
type live struct {
	mu    sync.Mutex
	rings map[string]*ring
}

// ring holds one policy's counts; slot i holds the second secs[i].
type ring struct {
	secs   [LiveSeconds]int64
	counts [LiveSeconds][numKinds]int64
}

func newLive() *live { return &live{rings: map[string]*ring{}} }

// add counts one decision of kind for policy at the Unix second sec.
func (l *live) add(policy string, kind sluice.Kind, sec int64) {
	if kind < sluice.Allowed || kind > sluice.Indeterminate {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[policy]
	if r == nil {
		r = new(ring)
		l.rings[policy] = r
	}
	i := slot(sec)
	if r.secs[i] != sec {
		r.secs[i] = sec
		r.counts[i] = [numKinds]int64{}
	}
	r.counts[i][kind-1]++
}

// keep drops the rings of policies not in ids (after a reload), except
// the label of unknown policies.
func (l *live) keep(ids map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.rings {
		if !ids[id] && id != UnknownPolicy {
			delete(l.rings, id)
		}
	}
}

// LiveSeries is one policy's decisions per second: Counts[kind][i] is the
// count of decisions with that outcome in the second End − LiveSeconds +
// 1 + i. Only outcomes that occurred in the span are present.
type LiveSeries struct {
	Policy string             `json:"policy"`
	Counts map[string][]int64 `json:"counts"`
	Total  map[string]int64   `json:"total"`
}

// series returns the counts of the seconds up to and including end for
// each of ids, in order (every id, even without decisions).
func (l *live) series(ids []string, end int64) []LiveSeries {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LiveSeries, 0, len(ids))
	for _, id := range ids {
		s := LiveSeries{Policy: id, Counts: map[string][]int64{}, Total: map[string]int64{}}
		for _, k := range []sluice.Kind{sluice.Allowed, sluice.Denied} {
			s.Counts[k.String()] = make([]int64, LiveSeconds)
			s.Total[k.String()] = 0
		}
		if r := l.rings[id]; r != nil {
			for j := range LiveSeconds {
				sec := end - LiveSeconds + 1 + int64(j)
				i := slot(sec)
				if r.secs[i] != sec {
					continue
				}
				for k, n := range r.counts[i] {
					if n == 0 {
						continue
					}
					name := sluice.Kind(k + 1).String()
					c := s.Counts[name]
					if c == nil {
						c = make([]int64, LiveSeconds)
						s.Counts[name] = c
					}
					c[j] += n
					s.Total[name] += n
				}
			}
		}
		out = append(out, s)
	}
	return out
}

func slot(sec int64) int {
	i := sec % LiveSeconds
	if i < 0 {
		i += LiveSeconds
	}
	return int(i)
}
