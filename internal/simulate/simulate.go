// Package simulate runs traffic patterns through rate-limiting policies on
// a virtual clock and measures how each algorithm's admissions compare
// with the exact definition of a limit: at most Limit units in any
// half-open interval (t−Window, t] of one window's length.
//
// The decisions are those of the real engine: every request is one
// internal/engine/algorithm.Evaluate on the state the previous decision left, as
// memstore runs it, at the request's virtual time. Nothing sleeps and
// nothing models the math a second time.
//
// The measures, per policy (see Result):
//
//   - MaxInWindow: the most units admitted in any interval (t−Window, t].
//   - False admissions and false denials, against an exact reference:
//     the definition itself run as a limiter on the same arrivals from
//     empty state. The reference admits a request at t iff the units it
//     has itself admitted in (t−Window, t), plus this one, are at most
//     Limit (an exact sliding log). A false admission is a request the
//     policy admits and the reference denies; a false denial is one the
//     policy denies and the reference admits. Both are counted as a share
//     of the offered requests. After a first disagreement the two
//     histories differ, so one early admission can show up again as a
//     later false denial (the policy's budget is spent when the
//     reference's is not); the sliding log scores zero on both.
//
// Everything here is pure and deterministic: the same Spec gives the same
// Result, bit for bit.
package simulate

import (
	"errors"
	"fmt"
	"sort"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// Bounds of a simulation, so that no input can make one run unbounded.
const (
	// MaxRequests is the most requests one run may offer.
	MaxRequests = 2_000_000
	// MaxPolicies is the most policies one run may compare.
	MaxPolicies = 16
)

// Policy is one algorithm with its numbers, as the engine takes them.
type Policy struct {
	// Name labels the policy in charts and tables, e.g. "gcra".
	Name   string
	Kind   algorithm.Kind
	Params algorithm.Params
}

// Kinds lists the five algorithms in their documented order, with their
// config spellings.
var Kinds = []struct {
	Name string
	Kind algorithm.Kind
}{
	{"fixed_window", algorithm.KindFixedWindow},
	{"sliding_log", algorithm.KindSlidingLog},
	{"sliding_window", algorithm.KindSlidingWindow},
	{"token_bucket", algorithm.KindTokenBucket},
	{"gcra", algorithm.KindGCRA},
}

// ParseKind maps a config spelling such as "token_bucket" to its Kind.
func ParseKind(s string) (algorithm.Kind, error) {
	for _, k := range Kinds {
		if k.Name == s {
			return k.Kind, nil
		}
	}
	return 0, fmt.Errorf("algorithm %q: must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra", s)
}

// KindName returns the config spelling of k.
func KindName(k algorithm.Kind) string {
	for _, kk := range Kinds {
		if kk.Kind == k {
			return kk.Name
		}
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Compare returns the five algorithms at the same numbers: limit per
// window, and for the bucket algorithms a bucket of burst (limit when 0).
func Compare(limit, window, burst int64) []Policy {
	if burst == 0 {
		burst = limit
	}
	ps := make([]Policy, len(Kinds))
	for i, k := range Kinds {
		p := algorithm.Params{Limit: limit, Window: window, Burst: limit}
		if k.Kind == algorithm.KindTokenBucket || k.Kind == algorithm.KindGCRA {
			p.Burst = burst
		}
		ps[i] = Policy{Name: k.Name, Kind: k.Kind, Params: p}
	}
	return ps
}

// Spec is one simulation: the offered requests and the policies they go
// through, each policy on fresh state of its own.
type Spec struct {
	// Start is the virtual time the chart starts at, µs since the Unix
	// epoch; Arrivals lie at or after it.
	Start int64
	// End is the virtual time the chart ends at; Arrivals lie before it.
	End int64
	// Arrivals are the request times in µs since the Unix epoch, one unit
	// each, ascending.
	Arrivals []int64
	Policies []Policy
}

// Result is what a simulation measured.
type Result struct {
	Spec    Spec
	Results []PolicyResult
}

// PolicyResult is what one policy did with the offered requests.
type PolicyResult struct {
	Policy Policy
	// Admitted holds one verdict per arrival, in order.
	Admitted []bool
	// Offered, Allowed and Denied count requests: Allowed + Denied =
	// Offered.
	Offered, Allowed, Denied int
	// MaxInWindow is the most units admitted in any half-open interval
	// (t−Window, t]; at most Limit under the exact definition. Example:
	// 19 for a fixed window of 10 per 10s on the boundary pattern.
	MaxInWindow int
	// MaxAt is the end t of the first interval holding MaxInWindow.
	MaxAt int64
	// FalseAdmits counts requests admitted that the exact reference
	// denies; FalseDenials counts requests denied that it admits (see
	// the package documentation).
	FalseAdmits, FalseDenials int
	// WindowStarts are the instants at which the fixed window opened a
	// window (only for fixed_window): its boundaries, which follow the
	// first admission rather than the clock.
	WindowStarts []int64
}

// MaxRatio returns MaxInWindow as a multiple of the limit, e.g. 1.9.
func (r *PolicyResult) MaxRatio() float64 {
	return float64(r.MaxInWindow) / float64(r.Policy.Params.Limit)
}

// FalseAdmitPct returns the false admissions as a percentage of the
// offered requests.
func (r *PolicyResult) FalseAdmitPct() float64 { return pct(r.FalseAdmits, r.Offered) }

// FalseDenialPct returns the false denials as a percentage of the offered
// requests.
func (r *PolicyResult) FalseDenialPct() float64 { return pct(r.FalseDenials, r.Offered) }

func pct(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// Error says which input broke which rule.
type Error struct {
	Field string // e.g. "policies[2].limit", "arrivals"
	Value string
	Rule  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s = %s: %s", e.Field, e.Value, e.Rule)
}

// Check reports the first input of s that a run cannot take, as an *Error.
func (s *Spec) Check() error {
	switch {
	case len(s.Policies) == 0:
		return &Error{"policies", "[]", "at least one policy is required"}
	case len(s.Policies) > MaxPolicies:
		return &Error{"policies", fmt.Sprint(len(s.Policies)), fmt.Sprintf("at most %d policies", MaxPolicies)}
	case len(s.Arrivals) > MaxRequests:
		return &Error{"arrivals", fmt.Sprint(len(s.Arrivals)), fmt.Sprintf("at most %d requests", MaxRequests)}
	case s.Start <= 0 || s.End <= s.Start:
		return &Error{"end", fmt.Sprint(s.End), fmt.Sprintf("must lie after start %d, which must be positive", s.Start)}
	}
	for i, p := range s.Policies {
		if err := p.Params.Check(p.Kind); err != nil {
			var re *algorithm.RangeError
			if errors.As(err, &re) {
				return &Error{fmt.Sprintf("policies[%d].%s", i, re.Field), fmt.Sprint(re.Value), re.Rule}
			}
			return err
		}
	}
	for i, t := range s.Arrivals {
		if t < s.Start || t >= s.End || i > 0 && t < s.Arrivals[i-1] {
			return &Error{fmt.Sprintf("arrivals[%d]", i), fmt.Sprint(t), "arrivals must be ascending and lie in [start, end)"}
		}
	}
	return nil
}

// Run decides every arrival of s under each policy and measures the
// results. It returns an *Error for a Spec that Check refuses.
func Run(s Spec) (*Result, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	res := &Result{Spec: s, Results: make([]PolicyResult, len(s.Policies))}
	for i, p := range s.Policies {
		r, err := runPolicy(p, s.Arrivals)
		if err != nil {
			return nil, fmt.Errorf("simulate: %s: %w", p.Name, err)
		}
		res.Results[i] = r
	}
	return res, nil
}

// runPolicy decides arrivals one by one with the engine, as a store does:
// read the state, Evaluate, apply the writes when the decision commits.
func runPolicy(p Policy, arrivals []int64) (PolicyResult, error) {
	r := PolicyResult{Policy: p, Admitted: make([]bool, len(arrivals)), Offered: len(arrivals)}
	var st algorithm.State
	var have bool
	ev := algorithm.Evaluation{
		Policies:      []algorithm.Policy{{Kind: p.Kind, Params: p.Params}},
		States:        make([]*algorithm.State, 1),
		Decisions:     make([]algorithm.Decision, 1),
		Writes:        make([]algorithm.Write, 1),
		Cost:          1,
		MaxRegression: -1,
	}
	// recent holds this policy's admissions still inside the window,
	// oldest first, for MaxInWindow; ref the exact reference's.
	var recent, ref []int64
	lastStart := int64(0)
	for i, t := range arrivals {
		ev.Now = t
		ev.States[0] = nil
		if have {
			ev.States[0] = &st
		}
		if err := algorithm.Evaluate(&ev); err != nil {
			return r, err
		}
		if ev.Commit {
			w := &ev.Writes[0]
			if w.Expires <= t {
				st, have = algorithm.State{}, false
			} else {
				st.Apply(w)
				have = true
			}
			if p.Kind == algorithm.KindFixedWindow && st.V[0] != lastStart {
				lastStart = st.V[0]
				r.WindowStarts = append(r.WindowStarts, lastStart)
			}
		}
		recent = inWindow(recent, t, p.Params.Window)
		ref = inWindow(ref, t, p.Params.Window)
		exact := int64(len(ref))+1 <= p.Params.Limit
		if exact {
			ref = append(ref, t)
		}
		allowed := ev.Decisions[0].Allowed
		r.Admitted[i] = allowed
		switch {
		case allowed:
			r.Allowed++
			recent = append(recent, t)
			if !exact {
				r.FalseAdmits++
			}
			if len(recent) > r.MaxInWindow {
				r.MaxInWindow, r.MaxAt = len(recent), t
			}
		default:
			r.Denied++
			if exact {
				r.FalseDenials++
			}
		}
	}
	return r, nil
}

// inWindow drops from admitted, ascending, the times that left the
// window (t−window, t].
func inWindow(admitted []int64, t, window int64) []int64 {
	cut := sort.Search(len(admitted), func(j int) bool { return admitted[j] > t-window })
	return admitted[cut:]
}

// TrailingCounts returns, for each arrival, the units r admitted in the
// window-long interval ending at it, (t−Window, t]: the quantity the exact
// definition bounds by Limit.
func (r *PolicyResult) TrailingCounts(arrivals []int64) []int {
	out := make([]int, len(arrivals))
	lo, n := 0, 0
	var admitted []int64
	for i, t := range arrivals {
		if r.Admitted[i] {
			admitted = append(admitted, t)
		}
		for lo < len(admitted) && admitted[lo] <= t-r.Policy.Params.Window {
			lo++
		}
		n = len(admitted) - lo
		out[i] = n
	}
	return out
}
