package redisstore_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/localquota"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// Local quota across real processes on real Redis: TestLocalQuotaProcesses
// starts the test binary four times over as TestLocalQuotaChild, each a
// Limiter with local quota on one Redis (standalone, then the 3-master
// cluster) and lqCallers goroutines on one subject, and judges what they
// admitted from the times each child read around each Check alone.
//
// lqMutateEnv, set when the test is run, dates the blocks wrong on
// purpose, to see the check catch it (a reached case then fails):
//
//	SLUICE_LQ_MUTATE=outlive  a block's status says its window ends one
//	                          window later, so the Limiter keeps admitting
//	                          from it past the window that counted it:
//	                          reached/fixed_window fails
//	SLUICE_LQ_MUTATE=nohold   blocks go to the store without their Hold,
//	                          so a bucket takes them as spent when taken,
//	                          not over the hold: gcra over-admits by what
//	                          blocks still hold once the store has
//	                          refilled them, a unit or two at these
//	                          numbers, so reached/gcra fails in about half
//	                          the runs only

const (
	lqChildEnv  = "SLUICE_LQ_CHILD"
	lqMutateEnv = "SLUICE_LQ_MUTATE"
	lqMark      = "lqchild " // the prefix of a child's own lines on stdout
	lqChildren  = 4
	lqCallers   = 8 // per child
	lqLeaders   = 2 // the children that offer traffic before the switch
)

// lqParams is what a child is told, as JSON in lqChildEnv.
type lqParams struct {
	Redis     string // "standalone:<addr>" or "cluster:<addr>,<addr>,…"
	Algorithm string // "gcra" or "fixed_window"
	Limit     int64
	Window    time.Duration
	Burst     int64
	Aligned   bool
	Subject   string
	Lead      time.Duration // this long at LeadRate first, ending on a window boundary of the clock
	Duration  time.Duration // then this long at Rate
	LeadRate  float64       // requests a second the child offers before the switch (0: none)
	Rate      float64       // and after it
	Gap       time.Duration // no requests in the last Gap before the switch
	Unpaced   bool          // no rates: as fast as the callers go
	Settle    time.Duration // decisions and store calls in the first Settle are not counted (a subject takes blocks after three block times)
	Record    bool          // print every admission
	Mutate    string
}

func (p lqParams) policy() (sluice.Policy, error) {
	pol := sluice.Policy{ID: "hot", Algorithm: sluice.FixedWindow, Limit: p.Limit, Window: p.Window, Burst: p.Burst,
		ClockAligned: p.Aligned, LocalQuota: sluice.LocalQuota{Enabled: true}}
	if p.Algorithm == "gcra" {
		pol.Algorithm = sluice.GCRA
	}
	if err := pol.Validate(); err != nil {
		return sluice.Policy{}, err
	}
	return evaluation.Defaults(pol), nil
}

// lqAdmission is one admitted request: the Unix times in µs a child read
// just before and just after its Check, and whether it came from a block.
type lqAdmission struct {
	B, A  int64
	Local bool `json:"L,omitempty"`
}

// lqSummary is a child's last line.
type lqSummary struct {
	Start, End         int64 // Unix µs: the child began offering, its last Check ended
	Decisions, Allowed int64
	Local              int64 // admissions marked Outcome.Local
	Calls              int64 // Evaluate calls its store was given
	Stats              localquota.Stats
	Failures           []string // the first outcomes that were no decision
	FailureCount       int64
}

// lqCountingStore is a real store with a count of the Evaluate calls made
// on it, and the mutations lqMutateEnv names. It has only Evaluate, so the
// Limiter uses no other part of the store (overrides are not polled).
type lqCountingStore struct {
	store  sluice.Store
	calls  atomic.Int64
	mutate string
}

func (s *lqCountingStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	s.calls.Add(1)
	block := ev.Hold > 0
	if block && s.mutate == "nohold" {
		ev.Hold = 0
	}
	err := s.store.Evaluate(ctx, ev)
	if err == nil && block && s.mutate == "outlive" && len(ev.Statuses) == 1 && ev.Statuses[0].Allowed {
		ev.Statuses[0].ResetAfter += ev.Policies[0].Window
	}
	return err
}

// TestLocalQuotaChild is the child half of TestLocalQuotaProcesses: it
// runs only when that test starts it with lqChildEnv set.
func TestLocalQuotaChild(t *testing.T) {
	spec := os.Getenv(lqChildEnv)
	if spec == "" {
		t.Skip("the child half of TestLocalQuotaProcesses: runs only when that test starts it")
	}
	if err := lqChild(spec, os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// lqChild connects, says "ready", waits for "go <start> <switch> <end>"
// on in (Unix µs), offers the subject its traffic from lqCallers
// goroutines from start to end, at LeadRate before switch and at Rate
// after, and prints its admissions (if asked) and its summary to out.
func lqChild(spec string, in io.Reader, out io.Writer) error {
	var p lqParams
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		return fmt.Errorf("%s: %w", lqChildEnv, err)
	}
	pol, err := p.policy()
	if err != nil {
		return err
	}
	var c redis.UniversalClient
	switch mode, addrs, _ := strings.Cut(p.Redis, ":"); mode {
	case "cluster":
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ","), ContextTimeoutEnabled: true})
	default:
		c = redis.NewClient(&redis.Options{Addr: addrs, ContextTimeoutEnabled: true})
	}
	defer c.Close()
	rs, err := redisstore.New(c, redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer rs.Close()
	store := &lqCountingStore{store: rs, mutate: p.Mutate}
	tally := new(localquota.Tally)
	l, err := sluice.New(store, []sluice.Policy{pol}, sluice.Options{OnLocalQuota: tally.Add})
	if err != nil {
		return err
	}
	ctx := context.Background()
	for range lqCallers { // warm the connections (and the cluster's slot map)
		if o := l.Check(ctx, sluice.Request{Op: sluice.Peek, Policy: "hot", Subject: p.Subject}); o.Kind != sluice.Allowed {
			return fmt.Errorf("warm-up peek: %v: %v", o.Kind, o.Err)
		}
	}
	store.calls.Store(0)
	fmt.Fprintln(out, lqMark+"ready")
	var start, switchAt, end int64
	if sc := bufio.NewScanner(in); !sc.Scan() {
		return fmt.Errorf("no go from the parent: %v", sc.Err())
	} else if _, err := fmt.Sscanf(sc.Text(), "go %d %d %d", &start, &switchAt, &end); err != nil {
		return fmt.Errorf("the parent said %q: %w", sc.Text(), err)
	}
	// Real time must pass: four processes share the windows of Redis's
	// clock and start together at the parent's instant (no fake clock
	// spans processes); this waits for it, at most the word's 10ms.
	time.Sleep(time.Until(time.UnixMicro(start)))
	var settled atomic.Int64 // the store calls made while the subject's rate was learnt
	time.AfterFunc(p.Settle, func() { settled.Store(store.calls.Load()) })
	sum, adm := lqOffer(ctx, l, p, time.UnixMicro(switchAt), time.UnixMicro(end))
	sum.Calls, sum.Stats = store.calls.Load()-settled.Load(), tally.Stats("hot")
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	for _, a := range adm {
		w.WriteString(lqMark)
		enc.Encode(a)
	}
	w.WriteString(lqMark)
	enc.Encode(sum)
	return w.Flush()
}

// lqOffer runs p's traffic on l until end: lqCallers goroutines, each
// paced with jitter (uniform, half to one and a half of its mean gap) at
// its share of p.LeadRate before switchAt (idle at 0) and of p.Rate after
// it, or unpaced with p.Unpaced. It returns the summary and, if p.Record,
// the admissions.
func lqOffer(ctx context.Context, l *sluice.Limiter, p lqParams, switchAt, end time.Time) (lqSummary, []lqAdmission) {
	start := time.Now()
	mean := func(at time.Time) time.Duration { // 0: idle
		rate := p.Rate
		if at.Before(switchAt) {
			rate = p.LeadRate
		}
		if rate <= 0 {
			return 0
		}
		return time.Duration(float64(lqCallers) / rate * float64(time.Second))
	}
	first := func() time.Time { // a caller's first request
		if d := mean(start); d > 0 {
			return start.Add(time.Duration(rand.Float64() * float64(d)))
		}
		return switchAt.Add(time.Duration(rand.Float64() * float64(mean(switchAt))))
	}
	var (
		mu  sync.Mutex
		sum = lqSummary{Start: start.Add(p.Settle).UnixMicro()} // what is counted starts after Settle
		adm []lqAdmission
		wg  sync.WaitGroup
	)
	for range lqCallers {
		wg.Go(func() {
			var mine []lqAdmission
			var s lqSummary
			next := first()
			for {
				if !p.Unpaced {
					// Real time must pass: the offered rate is what local
					// quota learns, against windows of the real clock.
					time.Sleep(time.Until(next))
					d := mean(next)
					if d == 0 {
						d = mean(switchAt)
					}
					next = next.Add(time.Duration((0.5 + rand.Float64()) * float64(d)))
					if next.Before(switchAt) && !next.Before(switchAt.Add(-p.Gap)) {
						next = switchAt.Add(time.Duration(rand.Float64() * float64(mean(switchAt))))
					}
				}
				before := time.Now()
				if !before.Before(end) {
					break
				}
				o := l.Check(ctx, sluice.Request{Policy: "hot", Subject: p.Subject})
				after := time.Now()
				if before.Sub(start) < p.Settle {
					if o.Kind != sluice.Allowed {
						s.FailureCount++ // never reached: every decision is allowed, counted or not
					}
					continue
				}
				s.Decisions++
				switch o.Kind {
				case sluice.Allowed:
					s.Allowed++
					if o.Local {
						s.Local++
					}
					if p.Record {
						mine = append(mine, lqAdmission{B: before.UnixMicro(), A: after.UnixMicro(), Local: o.Local})
					}
				case sluice.Denied:
				default:
					s.FailureCount++
					if len(s.Failures) < 3 {
						s.Failures = append(s.Failures, fmt.Sprintf("%v: %v", o.Kind, o.Err))
					}
				}
				s.End = after.UnixMicro()
			}
			mu.Lock()
			defer mu.Unlock()
			adm = append(adm, mine...)
			sum.Decisions, sum.Allowed, sum.Local = sum.Decisions+s.Decisions, sum.Allowed+s.Allowed, sum.Local+s.Local
			sum.FailureCount += s.FailureCount
			sum.Failures = append(sum.Failures, s.Failures...)
			sum.End = max(sum.End, s.End)
		})
	}
	wg.Wait()
	return sum, adm
}

// lqRun is what the children of one run said.
type lqRun struct {
	summaries []lqSummary
	adm       []lqAdmission
	fcalls    int64 // Redis's own count of decision calls over the run
	switchAt  int64 // Unix µs: when the children went from LeadRate to Rate
	end       int64 // and stopped
}

// lqStart runs lqChildren children with p and returns what they said. On
// failure it kills, by their handles, the children it started.
func lqStart(t *testing.T, c redis.UniversalClient, p lqParams) lqRun {
	t.Helper()
	p.Mutate = os.Getenv(lqMutateEnv)
	cs := startChildren(t, lqChildren, "^TestLocalQuotaChild$", lqMark, func(i int) string {
		cp := p
		if i >= lqLeaders {
			cp.LeadRate = 0
		}
		spec, err := json.Marshal(cp)
		if err != nil {
			t.Fatal(err)
		}
		return lqChildEnv + "=" + string(spec)
	})
	var run lqRun
	timeout := time.After(p.Lead + 2*p.Window + p.Duration + time.Minute)
	cs.waitReady(timeout)
	before := lqFcalls(t, c)
	w := p.Window.Microseconds()
	start := time.Now().Add(10 * time.Millisecond).UnixMicro() // time for the word to reach them
	run.switchAt = start
	if p.Lead > 0 { // to the next window boundary of the clock at least Lead away
		run.switchAt = (start + p.Lead.Microseconds() + w - 1) / w * w
		start = run.switchAt - p.Lead.Microseconds()
	}
	run.end = run.switchAt + p.Duration.Microseconds()
	cs.tell(func(int) string { return fmt.Sprintf("go %d %d %d", start, run.switchAt, run.end) })
	cs.waitDone(timeout)
	for i, ch := range cs.list {
		for j, line := range ch.lines {
			var err error
			if j == len(ch.lines)-1 {
				var s lqSummary
				err = json.Unmarshal([]byte(line), &s)
				run.summaries = append(run.summaries, s)
			} else {
				var a lqAdmission
				err = json.Unmarshal([]byte(line), &a)
				run.adm = append(run.adm, a)
			}
			if err != nil {
				cs.fail(i, fmt.Sprintf("said %q: %v", line, err))
			}
		}
	}
	run.fcalls = lqFcalls(t, c) - before
	return run
}

// lqGORACE returns the child's GORACE: the parent's, with no second of
// sleep at exit (the race detector's default) added to every run.
func lqGORACE() string {
	return strings.TrimSpace("GORACE=" + os.Getenv("GORACE") + " atexit_sleep_ms=0")
}

// lqFcalls returns the calls of FCALL and EVALSHA (the store's fallback)
// Redis has counted, summed over the masters (INFO commandstats).
func lqFcalls(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	ctx := context.Background()
	var n atomic.Int64
	count := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok || (name != "cmdstat_fcall" && name != "cmdstat_evalsha") {
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				return fmt.Errorf("INFO commandstats: %q: %w", line, err)
			}
			n.Add(v)
		}
		return nil
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, count)
	case *redis.Client:
		err = count(ctx, c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n.Load()
}

// total sums the children's summaries.
func (r lqRun) total() (s lqSummary) {
	s.Start, s.End = r.summaries[0].Start, r.summaries[0].End
	for _, c := range r.summaries {
		s.Start, s.End = min(s.Start, c.Start), max(s.End, c.End)
		s.Decisions, s.Allowed, s.Local, s.Calls = s.Decisions+c.Decisions, s.Allowed+c.Allowed, s.Local+c.Local, s.Calls+c.Calls
		s.Stats.Local, s.Stats.Blocks = s.Stats.Local+c.Stats.Local, s.Stats.Blocks+c.Stats.Blocks
		s.Stats.Units, s.Stats.Unused = s.Stats.Units+c.Stats.Units, s.Stats.Unused+c.Stats.Unused
		s.FailureCount += c.FailureCount
		s.Failures = append(s.Failures, c.Failures...)
	}
	return s
}

// TestLocalQuotaProcesses: four processes with local quota on one Redis
// (standalone and the 3-master cluster). With a limit never reached,
// every decision is allowed, from blocks. With a limit reached (four
// times the limit offered), no interval holds more than the algorithm
// allows, judged from the times around each Check alone, and blocks were
// taken. How few decisions reach the store (0.0038 per decision in a run
// on a loaded machine, where 0.02 was asserted) and how much of the bound
// is admitted (0.47 for gcra in that run, where half was asserted) depend
// on how fast the machine runs the children, so they are reported, not
// asserted: -v logs both.
func TestLocalQuotaProcesses(t *testing.T) {
	redistest.Long(t)
	t.Run("standalone", func(t *testing.T) {
		c := standaloneClient(t)
		testLocalQuotaProcesses(t, c, "standalone:"+shared.standalone.Addr)
	})
	t.Run("cluster", func(t *testing.T) {
		c := clusterClient(t)
		testLocalQuotaProcesses(t, c, "cluster:"+strings.Join(shared.cluster.Addrs, ","))
	})
}

func testLocalQuotaProcesses(t *testing.T, c redis.UniversalClient, spec string) {
	never := []lqParams{
		{Algorithm: "gcra", Limit: 1_000_000_000, Window: time.Second},
		{Algorithm: "fixed_window", Limit: 1_000_000_000, Window: time.Second, Aligned: true},
	}
	for _, p := range never {
		t.Run("never_reached/"+p.Algorithm, func(t *testing.T) {
			p.Redis, p.Subject, p.Duration, p.Unpaced, p.Settle = spec, subject(t), 2*time.Second, true, 500*time.Millisecond
			lqNeverReached(t, c, p)
		})
	}
	reached := []lqParams{ // LeadRate as a share of the limit, the numbers that show a wrong block best
		{Algorithm: "gcra", Limit: 200, Window: time.Second, Burst: 200, LeadRate: 0.35, Gap: 50 * time.Millisecond},
		{Algorithm: "fixed_window", Limit: 200, Window: time.Second, Aligned: true, LeadRate: 0.45},
	}
	for _, p := range reached {
		t.Run("reached/"+p.Algorithm, func(t *testing.T) {
			p.Redis, p.Subject, p.Record = spec, subject(t), true
			rate := float64(p.Limit) / p.Window.Seconds()
			p.Lead, p.LeadRate = 700*time.Millisecond, p.LeadRate*rate // lqLeaders of them: see lqReached
			p.Duration, p.Rate = 2*time.Second, rate                   // each child at the limit: four times it in all
			lqReached(t, c, p)
		})
	}
}

// lqNeverReached checks a run whose limit is never reached.
func lqNeverReached(t *testing.T, c redis.UniversalClient, p lqParams) {
	run := lqStart(t, c, p)
	s := run.total()
	perDecision := float64(s.Calls) / float64(max(s.Decisions, 1))
	t.Logf("%d decisions in %.2fs (%.0f/s), %d allowed, %d from %d blocks; %d store calls (%.4f per decision); Redis counted %d FCALL/EVALSHA",
		s.Decisions, float64(s.End-s.Start)/1e6, float64(s.Decisions)/(float64(s.End-s.Start)/1e6), s.Allowed, s.Local, s.Stats.Blocks, s.Calls, perDecision, run.fcalls)
	if s.FailureCount > 0 {
		t.Fatalf("%d checks were no decision, e.g. %q", s.FailureCount, s.Failures)
	}
	if s.Allowed != s.Decisions {
		t.Errorf("%d of %d decisions allowed under a limit never reached: want all", s.Allowed, s.Decisions)
	}
	if s.Decisions == 0 || s.Stats.Blocks == 0 || s.Local == 0 {
		t.Errorf("%d decisions, local quota did %+v, %d admissions marked Local: want decisions admitted from blocks", s.Decisions, s.Stats, s.Local)
	}
}

// lqReached checks a run whose limit is reached, from its admission times.
// For p.Lead up to a window boundary of the clock, lqLeaders children
// offer p.LeadRate each, less than the limit in all, with none in the
// last p.Gap; then all four offer the limit each, four times it in all,
// for p.Duration. The lead-in is what lets a block that is dated wrong
// show: under four times the limit from the start, blocks are taken only
// while much remains and are spent at once (in a bucket's burst, in a
// window's first quarter), so a block kept past its window, or spent in
// the store before its units are admitted, admits nothing the bound
// forbids. Below the limit blocks are taken up to the boundary and are in
// hand, part spent, when the demand jumps: kept past the window's end,
// what they hold adds to the next window's Limit; taken by a bucket as
// spent when taken, the gap has refilled it. Two children, not four, so
// that each asks enough per BlockTime for a block. The share is of the
// bound after the switch.
func lqReached(t *testing.T, c redis.UniversalClient, p lqParams) {
	pol, err := p.policy()
	if err != nil {
		t.Fatal(err)
	}
	run := lqStart(t, c, p)
	s := run.total()
	if s.FailureCount > 0 {
		t.Fatalf("%d checks were no decision, e.g. %q", s.FailureCount, s.Failures)
	}
	var v lqVerdict
	if pol.Algorithm == sluice.FixedWindow {
		v = lqFixedWindow(pol, run.adm, run.switchAt, run.end)
	} else {
		v = lqBucket(pol, run.adm, run.switchAt, run.end)
	}
	t.Logf("%d decisions, %d admitted, %d from %d blocks (%d units, %d unused), %d store calls, Redis counted %d FCALL/EVALSHA",
		s.Decisions, s.Allowed, s.Local, s.Stats.Blocks, s.Stats.Units, s.Stats.Unused, s.Calls, run.fcalls)
	t.Logf("admitted %d of a bound of %d (%.3f) over %s; tightest interval %s", v.admitted, v.bound, float64(v.admitted)/float64(max(v.bound, 1)), v.over, v.tightest)
	if v.violation != "" {
		t.Fatalf("more admitted than %s allows: %s", pol.Algorithm, v.violation)
	}
	if s.Stats.Blocks == 0 || s.Local == 0 {
		t.Errorf("local quota did %+v, %d admissions marked Local: no block was taken", s.Stats, s.Local)
	}
	if v.bound == 0 || v.admitted == 0 {
		t.Errorf("admitted %d of a bound of %d over %s: want some", v.admitted, v.bound, v.over)
	}
}

// lqVerdict is what a check found: the first interval holding more than
// the bound (or ""), the one closest to its bound, and what was admitted
// of the bound over the part of the run at four times the limit.
type lqVerdict struct {
	violation, tightest string
	admitted, bound     int64
	over                string
}

// lqBucket checks gcra (and token_bucket) admissions: every interval
// [a, b] holds at most Burst + ⌊(b − a)·Limit/Window⌋, counting only the
// admissions whose whole [before, after] lies inside it. Every pair of a
// before and an after is tried: the count only grows as a falls to a
// before or b rises to an after, so those are the intervals to try. The
// share is of the bound over [from, to].
func lqBucket(p sluice.Policy, adm []lqAdmission, from, to int64) lqVerdict {
	w := p.Window.Microseconds()
	byBefore := slices.Clone(adm)
	slices.SortFunc(byBefore, func(x, y lqAdmission) int { return cmp.Compare(x.B, y.B) })
	byAfter := slices.Clone(adm)
	slices.SortFunc(byAfter, func(x, y lqAdmission) int { return cmp.Compare(x.A, y.A) })
	v := lqVerdict{bound: p.Burst + (to-from)*p.Limit/w, over: lqSpan(from, to)}
	for _, a := range adm {
		if a.B >= from && a.A <= to {
			v.admitted++
		}
	}
	slack := int64(-1)
	for i, x := range byBefore {
		if i > 0 && x.B == byBefore[i-1].B {
			continue
		}
		var n int64
		for _, y := range byAfter {
			if y.B < x.B {
				continue
			}
			n++
			bound := p.Burst + (y.A-x.B)*p.Limit/w
			if slack < 0 || bound-n < slack {
				slack, v.tightest = bound-n, fmt.Sprintf("%s: %d admitted, bound %d", lqSpan(x.B, y.A), n, bound)
			}
			if n > bound && v.violation == "" {
				v.violation = v.tightest
			}
		}
	}
	return v
}

// lqFixedWindow checks clock-aligned fixed_window admissions: each window
// [kW, (k+1)W) of the clock holds at most Limit, counting only the
// admissions whose whole [before, after] lies inside it. The share is
// taken over the windows wholly inside [from, to].
func lqFixedWindow(p sluice.Policy, adm []lqAdmission, from, to int64) lqVerdict {
	w := p.Window.Microseconds()
	counts := make(map[int64]int64)
	for _, a := range adm {
		if k := a.B / w; a.A/w == k {
			counts[k]++
		}
	}
	first, last := (from+w-1)/w, to/w // the whole windows: [first, last)
	v := lqVerdict{bound: max(last-first, 0) * p.Limit, over: lqSpan(first*w, last*w)}
	slack := int64(-1)
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		n := counts[k]
		if k >= first && k < last {
			v.admitted += n
		}
		if slack < 0 || p.Limit-n < slack {
			slack, v.tightest = p.Limit-n, fmt.Sprintf("%s: %d admitted, bound %d", lqSpan(k*w, (k+1)*w), n, p.Limit)
		}
		if n > p.Limit && v.violation == "" {
			v.violation = v.tightest
		}
	}
	return v
}

// lqSpan formats [a, b] in Unix µs as clock times.
func lqSpan(a, b int64) string {
	return fmt.Sprintf("[%s, %s]", time.UnixMicro(a).UTC().Format("15:04:05.000000"), time.UnixMicro(b).UTC().Format("15:04:05.000000"))
}
