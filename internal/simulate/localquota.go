package simulate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/localquota"
	"github.com/sluicehq/sluice/memstore"
)

// The local-quota model of sluice simulate --local-quota: N instances, as N
// processes would be, each a real sluice.Limiter with local quota on, over
// one memstore and one virtual clock, offered ACCURACY.md's patterns with
// each request sent to an instance a seeded generator picks; beside it,
// one Limiter without local quota on the same arrivals. It lives here,
// not in internal/simulate, because it wires the root package's Limiters
// over memstore, which sit above the engine-only simulation in the layer
// map.

// LocalQuotaLimit is the limit the local-quota table runs at by default:
// 1000 × ACCURACY.md's 10 per 10 s, so that one instance sees the 4 units
// per block time a block needs (the patterns' rates scale with the
// limit).
const LocalQuotaLimit = 10_000

// lqLimit is LocalQuotaLimit, by the name the model's tests use.
const lqLimit = LocalQuotaLimit

// lqSubject is the one subject every request of the model names.
const lqSubject = "tenant-1"

// smallBurst is the share of the limit (1/smallBurst) the table's second
// pair of bucket rows holds: a bucket that small is where a block's units
// are a large part of what it can hold, and so where dating the block's
// spend wrong would show first.
const smallBurst = 50

// minLocalBurst is the smallest bucket local quota takes (Policy.LocalQuota:
// a max_cost of 8, which a bucket's size bounds).
const minLocalBurst = 8

// lqPolicies returns the policies the local-quota table runs, in its
// order: the algorithms that take local quota (sliding_log and
// sliding_window refuse it), at limit per window; the bucket ones with a
// bucket of burst (limit when 0), and again with one of limit/smallBurst.
func lqPolicies(limit int64, window time.Duration, burst int64) []sluice.Policy {
	on := sluice.LocalQuota{Enabled: true}
	small := limit / smallBurst
	return []sluice.Policy{
		{ID: "fixed_window", Algorithm: sluice.FixedWindow, Limit: limit, Window: window, LocalQuota: on},
		{ID: "fixed_window_aligned", Algorithm: sluice.FixedWindow, Limit: limit, Window: window, ClockAligned: true, LocalQuota: on},
		{ID: "token_bucket", Algorithm: sluice.TokenBucket, Limit: limit, Window: window, Burst: burst, LocalQuota: on},
		{ID: "gcra", Algorithm: sluice.GCRA, Limit: limit, Window: window, Burst: burst, LocalQuota: on},
		{ID: "token_bucket_small", Algorithm: sluice.TokenBucket, Limit: limit, Window: window, Burst: small, LocalQuota: on},
		{ID: "gcra_small", Algorithm: sluice.GCRA, Limit: limit, Window: window, Burst: small, LocalQuota: on},
	}
}

// lqName is the table's name of p: as ACCURACY.md's engine table names
// it, and the bucket's size where it is not the limit.
func lqName(p sluice.Policy) string {
	switch {
	case p.ClockAligned:
		return p.Algorithm.String() + " align=clock"
	case p.Burst != 0 && p.Burst != p.Limit:
		return fmt.Sprintf("%s burst=%d", p.Algorithm, p.Burst)
	}
	return p.Algorithm.String()
}

// lqModel is how the local-quota model runs.
type lqModel struct {
	// instances is how many Limiters share the traffic, at least 1.
	instances int
	// seed picks the instance of each request.
	seed uint64
	// wrap, when set, stands between the Limiters and the memstore: the
	// tests pass a store that dates blocks wrong, to see the bound check
	// fail.
	wrap func(sluice.Store) sluice.Store
}

// lqResult is one pattern through one policy.
type lqResult struct {
	pattern string
	policy  sluice.Policy // defaults applied
	offered int
	// local and exact are the admission times, µs, with local quota on
	// instances Limiters and with one Limiter without it.
	local, exact []int64
	// calls is the store decisions the local run took.
	calls int64
	// stats is what local quota did, summed over the instances.
	stats localquota.Stats
	// over describes the interval in which local's admissions are
	// furthest over the algorithm's bound, "" when none is over it;
	// overExact the same for exact (a check of the check).
	over, overExact string
}

// run offers arrivals (µs, ascending) to p with local quota on
// m.instances Limiters, and without it to one.
func (m lqModel) run(pattern string, p sluice.Policy, arrivals []int64) (*lqResult, error) {
	r := &lqResult{pattern: pattern, policy: evaluation.Defaults(p), offered: len(arrivals)}
	var err error
	if r.local, r.calls, r.stats, err = m.admit(p, arrivals, m.instances); err != nil {
		return nil, err
	}
	exact := p
	exact.LocalQuota = sluice.LocalQuota{}
	if r.exact, _, _, err = m.admit(exact, arrivals, 1); err != nil {
		return nil, err
	}
	origin := Epoch(p.Window.Microseconds())
	r.over = overBound(r.policy, r.local, origin)
	r.overExact = overBound(r.policy, r.exact, origin)
	return r, nil
}

// admit offers arrivals to n Limiters of p over one fresh memstore, each
// request to one picked by m.seed, and returns the admission times, the
// store decisions taken and what local quota did, summed.
func (m lqModel) admit(p sluice.Policy, arrivals []int64, n int) ([]int64, int64, localquota.Stats, error) {
	var stats localquota.Stats
	tally := new(localquota.Tally)
	clock := new(virtualClock)
	ms, err := memstore.New(memstore.Options{Clock: clock, SweepInterval: -1})
	if err != nil {
		return nil, 0, stats, err
	}
	defer ms.Close()
	counted := &countingStore{Store: ms}
	var store sluice.Store = counted
	if m.wrap != nil {
		store = m.wrap(counted)
	}
	limiters := make([]*sluice.Limiter, n)
	for i := range limiters {
		if limiters[i], err = sluice.New(store, []sluice.Policy{p}, sluice.Options{Clock: clock, OnLocalQuota: tally.Add}); err != nil {
			return nil, 0, stats, err
		}
	}
	rng := rand.New(rand.NewPCG(m.seed, 0x10ca1))
	ctx := context.Background()
	admitted := make([]int64, 0, len(arrivals))
	for _, t := range arrivals {
		clock.now.Store(t)
		l := limiters[rng.IntN(n)]
		switch o := l.Check(ctx, sluice.Request{Policy: p.ID, Subject: lqSubject}); o.Kind {
		case sluice.Allowed:
			admitted = append(admitted, t)
		case sluice.Denied:
		default:
			return nil, 0, stats, fmt.Errorf("check at %d µs: %v: %v", t, o.Kind, o.Err)
		}
	}
	return admitted, counted.calls.Load(), tally.Stats(p.ID), nil
}

// virtualClock is the model's clock, µs since the Unix epoch, moved to
// each arrival before it is offered. Safe for concurrent use.
type virtualClock struct{ now atomic.Int64 }

func (c *virtualClock) Now() time.Time { return time.UnixMicro(c.now.Load()) }

// countingStore is the memstore, counting the decisions asked of it.
type countingStore struct {
	*memstore.Store
	calls atomic.Int64
}

func (s *countingStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	s.calls.Add(1)
	return s.Store.Evaluate(ctx, ev)
}

// windowBound returns the most units p's algorithm can admit in one
// half-open interval of a window's length: 2 × Limit − 1 for the fixed
// windows, Burst + Limit for the buckets.
func windowBound(p sluice.Policy) int64 {
	if p.Algorithm == sluice.FixedWindow {
		return 2*p.Limit - 1
	}
	return p.Burst + p.Limit
}

// maxInWindow returns the most of admitted (µs, ascending, one unit each)
// in any half-open interval (t − window, t].
func maxInWindow(admitted []int64, window time.Duration) int {
	w, most := window.Microseconds(), 0
	for i, j := 0, 0; j < len(admitted); j++ {
		for admitted[j]-admitted[i] >= w {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}

// overBound is OverBound for p.
func overBound(p sluice.Policy, admitted []int64, origin int64) string {
	p = evaluation.Defaults(p)
	return OverBound(algorithm.Kind(p.Algorithm), algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst, Aligned: p.ClockAligned}, admitted, origin)
}

// lqHeader is the head of the local-quota table of ACCURACY.md.
const lqHeader = "| pattern | algorithm | offered | admitted: local ÷ exact | most in any window (× limit): local | exact | bound | every interval within the bound | store calls per decision | unused ÷ admitted |\n" +
	"|---|---|--:|--:|--:|--:|--:|:-:|--:|--:|"

// row returns r as a row of the local-quota table.
func (r *lqResult) row() string {
	p := r.policy
	times := func(n int64) string { return fmt.Sprintf("%d (%.2f×)", n, float64(n)/float64(p.Limit)) }
	kept := "yes"
	if r.over != "" {
		kept = "**no**: " + r.over
	}
	ratio := 1.0
	if len(r.exact) > 0 {
		ratio = float64(len(r.local)) / float64(len(r.exact))
	}
	perDecision := float64(r.calls) / float64(max(r.offered, 1))
	return fmt.Sprintf("| %s | %s | %d | %d ÷ %d = %.3f | %s | %s | %s | %s | %.4f | %.2f %% |",
		r.pattern, lqName(p), r.offered, len(r.local), len(r.exact), ratio,
		times(int64(maxInWindow(r.local, p.Window))), times(int64(maxInWindow(r.exact, p.Window))), times(windowBound(p)),
		kept, perDecision, 100*float64(r.unused())/float64(max(len(r.local), 1)))
}

// unused returns the units r's blocks took that nobody was admitted:
// the unused units (localquota.Stats.Unused), plus what was still in hand when the pattern ended
// (a block's first unit goes to the request that took it, each local
// decision to one more).
func (r *lqResult) unused() int64 {
	return r.stats.Units - r.stats.Blocks - r.stats.Local
}

// LocalQuotaPolicies returns the policies the local-quota table runs at
// limit per window, with a bucket of burst (limit when 0), or an error
// that names the flag (--limit, --local-quota) the numbers came from.
func LocalQuotaPolicies(limit int64, window time.Duration, burst int64) ([]sluice.Policy, error) {
	if least := int64(smallBurst * minLocalBurst); limit < least {
		return nil, fmt.Errorf("--limit %d: must be at least %d with --local-quota: its small buckets hold a %dth of the limit, and local quota needs a bucket of %d", limit, least, smallBurst, minLocalBurst)
	}
	policies := lqPolicies(limit, window, burst)
	for _, p := range policies {
		if err := p.Validate(); err != nil {
			return nil, errors.New("--local-quota: " + strings.TrimPrefix(err.Error(), "sluice: "))
		}
	}
	return policies, nil
}

// LocalQuotaTable runs every pattern of LocalQuotaPatterns (spec
// gives each one's shape) through policies, each on instances Limiters
// with local quota sharing one memstore, the instance of each request
// picked with seed, and returns ACCURACY.md's local-quota table.
func LocalQuotaTable(policies []sluice.Policy, instances int, seed uint64, spec func(name string) PatternSpec) (string, error) {
	results, err := lqModel{instances: instances, seed: seed}.table(policies, spec)
	if err != nil {
		return "", err
	}
	return lqTable(results), nil
}

// lqTable returns results as ACCURACY.md's local-quota table.
func lqTable(results []*lqResult) string {
	var b strings.Builder
	b.WriteString(lqHeader + "\n")
	for _, r := range results {
		b.WriteString(r.row() + "\n")
	}
	return b.String()
}

// table runs every pattern of LocalQuotaPatterns, aimed at the
// first policy's limit and window, through each of policies: a row per
// pattern and policy, in that order. The rows are independent, each on a
// store and a clock of its own, so they run on every CPU at once and
// come out the same as one by one.
func (m lqModel) table(policies []sluice.Policy, spec func(name string) PatternSpec) ([]*lqResult, error) {
	aim := policies[0]
	type job struct {
		pattern  string
		policy   sluice.Policy
		arrivals []int64
	}
	var jobs []job
	for _, name := range LocalQuotaPatterns {
		arrivals, _, _, err := Generate(spec(name), aim.Limit, aim.Window.Microseconds())
		if err != nil {
			return nil, fmt.Errorf("pattern %s: %w", name, err)
		}
		for _, p := range policies {
			jobs = append(jobs, job{name, p, arrivals})
		}
	}
	out := make([]*lqResult, len(jobs))
	errs := make([]error, len(jobs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(jobs); i = int(next.Add(1) - 1) {
				j := jobs[i]
				if out[i], errs[i] = m.run(j.pattern, j.policy, j.arrivals); errs[i] != nil {
					errs[i] = fmt.Errorf("pattern %s, %s: %w", j.pattern, lqName(j.policy), errs[i])
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
