package simulate

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// PostHoc is the post-hoc-cost pattern (issue 33): every arrival spends an
// estimate (algorithm.OpEstimate) and, once admitted, its work runs for
// Work µs and is settled (OpSettle) with an actual cost off the estimate
// by a random factor, unless its caller crashes first and never settles
// (the estimate stays spent). Run by RunPostHoc, on the engine as
// memstore runs it.
type PostHoc struct {
	// Estimate is what each request spends up front, in units. Default:
	// a tenth of the limit, at least 1.
	Estimate int64
	// Low and High bound the factor the actual cost is off the estimate
	// by, drawn uniformly: actual = round(Estimate × factor). Default:
	// 0.25 and 3.
	Low, High float64
	// Crash is the share of admitted requests whose caller crashes before
	// it settles, in [0, 1]. Default: 0.1.
	Crash float64
	// Work is how long a request runs between its estimate and its
	// settle, µs. Default: a tenth of the window.
	Work int64
	// Seed makes the factors and crashes repeatable. Default: 1.
	Seed uint64
}

// PostHocResult is what one policy did with the post-hoc pattern.
type PostHocResult struct {
	Policy Policy
	// Offered, Admitted, Settled and Crashed count requests; Admitted =
	// Settled + Crashed (those still running at the end settle).
	Offered, Admitted, Settled, Crashed int
	// MaxUsed is the most units really used (a settled request's actual
	// cost, a crashed one's estimate, dated at its admission) in any
	// half-open interval (t−Window, t]; MaxCharged the units the settles
	// of that interval's requests charged past their estimates; Excess
	// the most, over all such intervals, of used − charged: the algorithm's
	// own bound without settles (Limit for sliding_log) is what it must
	// stay within.
	MaxUsed, MaxCharged, Excess int64
	// Charged, GivenBack: what all the settles did, in units.
	Charged, GivenBack int64
}

// defaults returns ph with its zero fields set for a limit per window.
func (ph PostHoc) defaults(limit, window int64) PostHoc {
	if ph.Estimate == 0 {
		ph.Estimate = max(limit/10, 1)
	}
	if ph.Low == 0 && ph.High == 0 {
		ph.Low, ph.High = 0.25, 3
	}
	if ph.Crash == 0 {
		ph.Crash = 0.1
	}
	if ph.Work == 0 {
		ph.Work = max(window/10, 1)
	}
	if ph.Seed == 0 {
		ph.Seed = 1
	}
	return ph
}

// check reports the first field of ph a run cannot take, as an *Error.
func (ph PostHoc) check(p Policy) error {
	switch {
	case ph.Estimate < 1 || ph.Estimate > p.Params.Capacity(p.Kind):
		return &Error{"estimate", fmt.Sprint(ph.Estimate), fmt.Sprintf("must be 1 to the policy's capacity, %d", p.Params.Capacity(p.Kind))}
	case !(ph.Low >= 0 && ph.Low <= ph.High && ph.High <= 100):
		return &Error{"spread", fmt.Sprintf("%g..%g", ph.Low, ph.High), "the factors must satisfy 0 <= low <= high <= 100"}
	case !(ph.Crash >= 0 && ph.Crash <= 1):
		return &Error{"crash", fmt.Sprint(ph.Crash), "must be a share in [0, 1]"}
	case ph.Work < 0:
		return &Error{"work", fmt.Sprint(ph.Work), "must not be negative"}
	}
	return algorithm.Check(algorithm.OpEstimate, []algorithm.Policy{{Kind: p.Kind, Params: p.Params, ID: p.Name, MaxCost: p.Params.Capacity(p.Kind)}}, ph.Estimate, 0, "", true)
}

// postHocRun is one policy's state and requests in flight in RunPostHoc.
type postHocRun struct {
	p       algorithm.Policy
	st      algorithm.State
	have    bool
	ev      algorithm.Evaluation
	pending []postHocReq // admitted, settling in order
	done    []postHocReq // admitted, by admission time
}

// postHocReq is one admitted request.
type postHocReq struct {
	at, settleAt   int64
	estimate, used int64
	crash          bool
	charged        int64
}

// RunPostHoc decides arrivals (one request each, ascending) under p with
// the post-hoc pattern ph, and measures what was used against what the
// settles charged.
func RunPostHoc(p Policy, arrivals []int64, ph PostHoc) (PostHocResult, error) {
	ph = ph.defaults(p.Params.Limit, p.Params.Window)
	if err := ph.check(p); err != nil {
		return PostHocResult{}, err
	}
	r := &postHocRun{p: algorithm.Policy{Kind: p.Kind, Params: p.Params, ID: p.Name, MaxCost: p.Params.Capacity(p.Kind)}}
	r.ev = algorithm.Evaluation{Policies: []algorithm.Policy{r.p}, States: make([]*algorithm.State, 1),
		Decisions: make([]algorithm.Decision, 1), Writes: make([]algorithm.Write, 1), MaxRegression: -1}
	rng := rand.New(rand.NewPCG(ph.Seed, 33))
	res := PostHocResult{Policy: p, Offered: len(arrivals)}
	for _, t := range arrivals {
		if err := r.settleUntil(t, &res); err != nil {
			return res, err
		}
		d, err := r.decide(algorithm.OpEstimate, t, ph.Estimate, nil)
		if err != nil {
			return res, err
		}
		if !d.Allowed {
			continue
		}
		factor := ph.Low + (ph.High-ph.Low)*rng.Float64()
		q := postHocReq{at: t, settleAt: t + ph.Work, estimate: ph.Estimate, used: int64(float64(ph.Estimate)*factor + 0.5), crash: rng.Float64() < ph.Crash}
		res.Admitted++
		if q.crash {
			q.used = q.estimate // never settled: the estimate stays spent
			res.Crashed++
			r.done = append(r.done, q)
			continue
		}
		r.pending = append(r.pending, q)
	}
	if err := r.settleUntil(1<<62, &res); err != nil {
		return res, err
	}
	res.measure(r.done, p.Params.Window)
	return res, nil
}

// settleUntil settles, in order, the requests whose work ends at or
// before t.
func (r *postHocRun) settleUntil(t int64, res *PostHocResult) error {
	for len(r.pending) > 0 && r.pending[0].settleAt <= t {
		q := r.pending[0]
		r.pending = r.pending[1:]
		rec := &algorithm.Record{Decisions: []algorithm.Decision{{Allowed: true, Limit: 1}}, Extra: algorithm.EstimateExtra(q.estimate, q.at)}
		if _, err := r.decide(algorithm.OpSettle, q.settleAt, q.used, rec); err != nil {
			return err
		}
		q.charged = r.ev.Extra[0]
		res.Settled++
		res.Charged += r.ev.Extra[0]
		res.GivenBack += r.ev.Extra[1]
		r.done = append(r.done, q)
	}
	return nil
}

// decide takes op with cost at now on r's state (est: a settle's
// estimate) and keeps what it writes, as a store does.
func (r *postHocRun) decide(op algorithm.Op, now, cost int64, est *algorithm.Record) (algorithm.Decision, error) {
	ev := &r.ev
	ev.Op, ev.Now, ev.Cost, ev.Estimate, ev.States[0] = op, now, cost, est, nil
	if r.have {
		ev.States[0] = &r.st
	}
	var err error
	if op == algorithm.OpSettle {
		err = algorithm.EvaluateSettle(ev)
	} else {
		err = algorithm.Evaluate(ev)
	}
	if err != nil {
		return algorithm.Decision{}, err
	}
	if ev.Commit {
		if w := &ev.Writes[0]; w.Expires <= now {
			r.st, r.have = algorithm.State{}, false
		} else {
			r.st.Apply(w)
			r.have = true
		}
	}
	return ev.Decisions[0], nil
}

// measure sets MaxUsed, MaxCharged and Excess from done, the admitted
// requests (sorted here by admission), over every interval (t−window, t]
// ending at an admission.
func (res *PostHocResult) measure(done []postHocReq, window int64) {
	sortByAt(done)
	lo := 0
	var used, charged int64
	for _, q := range done {
		used, charged = used+q.used, charged+q.charged
		for done[lo].at <= q.at-window {
			used, charged = used-done[lo].used, charged-done[lo].charged
			lo++
		}
		if used > res.MaxUsed {
			res.MaxUsed, res.MaxCharged = used, charged
		}
		res.Excess = max(res.Excess, used-charged)
	}
}

// sortByAt sorts qs by admission time (settles append them out of order).
func sortByAt(qs []postHocReq) {
	slices.SortStableFunc(qs, func(a, b postHocReq) int { return cmp.Compare(a.at, b.at) })
}

// PostHocTable returns the Markdown table of post-hoc results.
func PostHocTable(rs []PostHocResult) string {
	var b strings.Builder
	b.WriteString("| policy | offered | admitted | crashed | most used in a window | charged by its settles | used − charged, at most | limit |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d |\n", r.Policy.Name, r.Offered, r.Admitted, r.Crashed, r.MaxUsed, r.MaxCharged, r.Excess, r.Policy.Params.Limit)
	}
	return b.String()
}

// PostHocAccuracy runs the post-hoc pattern ph on Poisson arrivals (at
// twice limit per window, over 30 windows, seeded by ph.Seed) through the
// four algorithms that take estimates at limit per window (µs), burst for
// the buckets, and returns ACCURACY.md's post-hoc table. An error names
// the flag (FlagError).
func PostHocAccuracy(limit, window, burst int64, ph PostHoc) (string, error) {
	arrivals, _, _, err := Generate(PatternSpec{Name: Poisson, Seed: ph.Seed}, limit, window)
	if err != nil {
		return "", FlagError(err)
	}
	var rs []PostHocResult
	for _, p := range Compare(limit, window, burst) {
		if p.Kind == algorithm.KindSlidingWindow {
			continue // cannot settle
		}
		if err := p.Params.Check(p.Kind); err != nil {
			return "", FlagError(err)
		}
		r, err := RunPostHoc(p, arrivals, ph)
		if err != nil {
			return "", FlagError(err)
		}
		rs = append(rs, r)
	}
	return PostHocTable(rs), nil
}

// PostHocPattern is the name sluice simulate's --pattern takes for the
// post-hoc pattern (WritePostHoc).
const PostHocPattern = "post_hoc"

// WritePostHoc writes to w ACCURACY.md's post-hoc table at limit per
// window (µs), burst for the buckets, seeded by seed: sluice simulate
// --pattern post_hoc. set are the flags given: the pattern runs at its
// defaults, so the flags that shape other patterns are refused.
func WritePostHoc(w io.Writer, set map[string]bool, limit, window, burst int64, seed uint64) error {
	for _, f := range []string{"accuracy", "local-quota", "csv", "policy", "out", "rate", "duration", "on", "off"} {
		if set[f] {
			return fmt.Errorf("simulate: --pattern %s runs at its defaults: leave out --%s", PostHocPattern, f)
		}
	}
	table, err := PostHocAccuracy(limit, window, burst, PostHoc{Seed: seed})
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	_, err = io.WriteString(w, table)
	return errors.Join(err)
}
