package rlqs_test

// The fleet tests (issue 49, "Done when"): fleets of the test kit's Envoy
// model (internal/testkit/envoyrlqs) over real gRPC streams against real
// `sluice serve` processes (internal/testkit/servetest), checking the bound
// of docs/rlqs.md on what the fleet admits.
//
// Time. The proxies share one virtual clock that the test moves in steps
// of 100 ms (requests are offered at each step), firing their reports
// every 5 virtual seconds as Envoy does; the server's rounds run on real
// time (round: 100ms). The test waits on events only: after every step,
// for the answers to every report sent (Proxy.Await); after every
// periodic report, for two more of the server's split rounds, read from
// its /metrics (sluice_rlqs_rounds_total) with a bounded poll — the
// server is a process of its own, and its counter is the only event it
// offers. The virtual clock does not move while the test waits, so a
// round's pushes are applied at the virtual time of the report they
// follow, or at the next step at the latest.
//
// The bound's terms in virtual time (docs/rlqs.md, "The bound"). For a
// window [t, t+T] the fleet admits at most r·T + b + M + X + F:
//   - M: the proof's own form, the token jumps of assignments applied
//     during the window, read from the kit's events (TokensAfter −
//     TokensBefore, positive part), which are at most the statement's
//     max_tokens increases (or whole max_tokens of a new assignment). The
//     statement's [t − τ, t + T] widens "applied" to "sent" by the
//     delivery delay τ; here every message is applied at the virtual time
//     the test next calls into its proxy, so counting applications in
//     [t, t + T] is the statement with τ = 0 (nothing the server sent is
//     applied outside the window it is counted in).
//   - X: streams that ended while their Envoy kept enforcing: none here
//     (a closed proxy offers nothing more; a SIGTERM's streams end after
//     their TTL 0 was applied), so X = 0.
//   - F, assumption 2: each stretch a proxy spends in its expired-
//     assignment fallback adds the fallback's max_tokens plus its rate ×
//     the stretch's overlap with the window (the fallback's own jump is
//     counted here, not in M). NoAssignment is DENY_ALL: it admits
//     nothing.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// The policy every fleet test splits: 400 a second, burst 400 (a share
// of a few tokens a second: TestFleetLowRate, where shares are smaller).
const (
	fleetRate  = 400
	fleetBurst = 400
	step       = 100 * time.Millisecond // the virtual step at which requests are offered
	period     = 5 * time.Second        // Envoy's report period
)

// tenantA is the one bucket the fleets share.
var tenantA = map[string]string{"tenant": "a"}

// fleetConfig is `sluice serve`'s config: the Envoy listener with only
// RLQS, rounds of 100 ms, store (a line, or "" for the embedded one).
func fleetConfig(store string, perStream, perDomain int) string {
	return policyConfig(store, perStream, perDomain, fleetRate, fleetBurst)
}

// policyConfig is fleetConfig with the policy rate a second, burst burst.
func policyConfig(store string, perStream, perDomain, rate, burst int) string {
	return fmt.Sprintf(`server: { listen: "127.0.0.1:0" }
%s
policies:
  - { id: per-tenant, algorithm: token_bucket, limit: %d, window: 1s, burst: %d }
envoy:
  listen: "127.0.0.1:0"
  rlqs:
    round: 100ms
    max_buckets_per_stream: %d
    max_buckets_per_domain: %d
    domains:
      - domain: edge
        buckets:
          - match: { tenant: "*" }
            policy: per-tenant
`, store, rate, burst, perStream, perDomain)
}

// startServe runs `sluice serve` on cfg as a process of its own, stopped
// (if the test has not) when t ends.
func startServe(t *testing.T, cfg string) *servetest.Process {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := servetest.Start(servetest.Binary(t), servetest.Options{}, "serve", "-c", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			t.Errorf("sluice serve (pid %d): %v after SIGTERM, want a clean shutdown\n%s", p.PID(), err, p.Logs())
		}
	})
	if p.RLSAddr() == "" {
		t.Fatalf("sluice serve logged no Envoy listener:\n%s", p.Logs())
	}
	return p
}

// metric returns the sum of the samples of name (any labels) on p's
// /metrics.
func metric(ctx context.Context, p *servetest.Process, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("/metrics: %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// awaitRounds waits until p has run n more split rounds than now: a
// bounded poll of its /metrics (the process offers no other event).
func awaitRounds(ctx context.Context, p *servetest.Process, n float64) error {
	start, err := metric(ctx, p, "sluice_rlqs_rounds_total")
	if err != nil {
		return err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("await %v rounds of pid %d: %w", n, p.PID(), ctx.Err())
		case <-tick.C:
		}
		got, err := metric(ctx, p, "sluice_rlqs_rounds_total")
		if err != nil {
			return err
		}
		if got >= start+n {
			return nil
		}
	}
}

// phase is a stretch of demand: per second, offer[i] requests at proxy i
// (spread over the steps of each second).
type phase struct {
	name  string
	dur   time.Duration
	offer []float64
}

// skewed is the demand: 3 times the limit offered in all, 90 %
// at proxy hot and the rest shared by the others; hot = −1 offers 1.5
// times the limit at every proxy instead (each over the whole limit, so
// that the static split shows its N × the limit).
func skewed(name string, n, hot int, dur time.Duration) phase {
	total := 3.0 * fleetRate
	ph := phase{name: name, dur: dur, offer: make([]float64, n)}
	for i := range ph.offer {
		switch {
		case hot < 0:
			ph.offer[i] = 1.5 * fleetRate
		case n == 1:
			ph.offer[i] = total
		case i == hot:
			ph.offer[i] = 0.9 * total
		default:
			ph.offer[i] = 0.1 * total / float64(n-1)
		}
	}
	return ph
}

// sim drives proxies on one virtual clock.
type sim struct {
	t       *testing.T
	ctx     context.Context
	proxies []*envoyrlqs.Proxy
	servers []*servetest.Process // whose rounds follow each report; none for a static server
	ended   bool                 // streams may have ended: their lost reports are no failure
	now     time.Duration
	carry   []float64
}

// run offers ph's demand step by step. After every step it awaits the
// answers to every report, and after every periodic report two rounds of
// each server.
func (s *sim) run(ph phase) {
	s.t.Helper()
	if s.carry == nil {
		s.carry = make([]float64, len(s.proxies))
	}
	for end := s.now + ph.dur; s.now < end; {
		for i, p := range s.proxies {
			s.carry[i] += ph.offer[i] * step.Seconds()
			for ; s.carry[i] >= 1; s.carry[i]-- {
				p.Admit(tenantA)
			}
		}
		for _, p := range s.proxies {
			p.Advance(step)
		}
		s.now += step
		s.await()
		if s.now%period == 0 {
			for _, sv := range s.servers {
				if err := awaitRounds(s.ctx, sv, 2); err != nil {
					s.t.Fatal(err)
				}
			}
		}
	}
}

// await awaits every proxy's answers.
func (s *sim) await() {
	s.t.Helper()
	for i, p := range s.proxies {
		if err := p.Await(s.ctx); err != nil && !(s.ended && errors.Is(err, envoyrlqs.ErrStreamEnded)) {
			s.t.Fatalf("proxy %d at %v: %v", i, s.now, err)
		}
	}
}

// admitted is what the proxies admitted in [from, to).
func admitted(ps []*envoyrlqs.Proxy, from, to time.Duration) int {
	n := 0
	for _, p := range ps {
		for _, at := range p.Admissions(tenantA) {
			if at >= from && at < to {
				n++
			}
		}
	}
	return n
}

// jump is a token jump (M) at a virtual time.
type jump struct {
	at     time.Duration
	tokens float64
}

// stretch is a proxy's time in its expired-assignment fallback (F).
type stretch struct {
	from, to  time.Duration
	max, rate float64
}

// terms reads M's jumps and F's stretches from the proxies' events,
// until end.
func terms(ps []*envoyrlqs.Proxy, end time.Duration) ([]jump, []stretch) {
	var js []jump
	var ss []stretch
	key := envoyrlqs.Key(tenantA)
	for _, p := range ps {
		open := -1
		for _, e := range p.Events() {
			if e.Key != key || e.Kind == envoyrlqs.Ignored {
				continue
			}
			if open >= 0 {
				ss[open].to, open = e.At, -1
			}
			if e.Kind == envoyrlqs.AssignmentExpired && e.Strategy.GetTokenBucket() != nil {
				tb := e.Strategy.GetTokenBucket()
				rate := float64(tb.GetTokensPerFill().GetValue()) / math.Max(1, float64(tb.GetFillInterval().GetSeconds()))
				ss = append(ss, stretch{from: e.At, to: end, max: float64(tb.GetMaxTokens()), rate: rate})
				open = len(ss) - 1
				continue
			}
			if d := e.TokensAfter - e.TokensBefore; d > 0 {
				js = append(js, jump{e.At, d})
			}
		}
	}
	return js, ss
}

// boundCheck is the worst window of one length: the most admitted in a
// window and that window's bound, and the least slack (bound − admitted)
// seen in any window.
type boundCheck struct {
	window        time.Duration
	most          int
	mostAt        time.Duration
	boundAtMost   float64
	slack         float64
	slackAt       time.Duration
	admittedSlack int
}

// checkBound checks r·T + b + M + F ≥ what ps admitted in every window
// [t, t+w] with t on the step grid in [0, end − w], and returns the
// worst.
func checkBound(ps []*envoyrlqs.Proxy, w, end time.Duration, r, b float64) boundCheck {
	js, ss := terms(ps, end)
	var ts []time.Duration
	for _, p := range ps {
		ts = append(ts, p.Admissions(tenantA)...)
	}
	slices.Sort(ts)
	bc := boundCheck{window: w, slack: math.Inf(1)}
	for t := time.Duration(0); t+w <= end; t += step {
		lo, _ := slices.BinarySearch(ts, t)
		hi, _ := slices.BinarySearch(ts, t+w+1)
		n := hi - lo
		bound := r*w.Seconds() + b
		for _, j := range js {
			if j.at >= t && j.at <= t+w {
				bound += j.tokens
			}
		}
		for _, s := range ss {
			if lo, hi := max(s.from, t), min(s.to, t+w); lo <= hi {
				bound += s.max + s.rate*(hi-lo).Seconds()
			}
		}
		if n > bc.most {
			bc.most, bc.mostAt, bc.boundAtMost = n, t, bound
		}
		if sl := bound - float64(n); sl < bc.slack {
			bc.slack, bc.slackAt, bc.admittedSlack = sl, t, n
		}
	}
	return bc
}

// assertBound checks every 1 s and 10 s window and the whole run.
func assertBound(t *testing.T, label string, ps []*envoyrlqs.Proxy, end time.Duration) {
	t.Helper()
	assertPolicyBound(t, label, ps, end, fleetRate, fleetBurst)
}

// assertPolicyBound is assertBound for the policy (r, b).
func assertPolicyBound(t *testing.T, label string, ps []*envoyrlqs.Proxy, end time.Duration, r, b float64) {
	t.Helper()
	for _, w := range []time.Duration{time.Second, 10 * time.Second, end} {
		bc := checkBound(ps, w, end, r, b)
		t.Logf("%s: windows of %v: most admitted %d (at %v, bound there %.0f); least slack %.0f (at %v, %d admitted)",
			label, w, bc.most, bc.mostAt, bc.boundAtMost, bc.slack, bc.slackAt, bc.admittedSlack)
		if bc.slack < 0 {
			t.Errorf("%s: the window [%v, %v] admitted %d, %.0f over the bound r·T + b + M + F",
				label, bc.slackAt, bc.slackAt+w, bc.admittedSlack, -bc.slack)
		}
	}
}

// staticServer is the baseline the issue compares with (jukie/rlqs's
// answer): every report of every bucket answered with the whole policy,
// so each proxy enforces the whole limit alone. It serves on loopback
// until t ends.
type staticServer struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
}

func (staticServer) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	whole := envoyrlqs.TokenBucket(fleetBurst, fleetRate, time.Second)
	for {
		r, err := st.Recv()
		if err != nil {
			return nil
		}
		resp := &rlqspb.RateLimitQuotaResponse{}
		for _, u := range r.GetBucketQuotaUsages() {
			resp.BucketAction = append(resp.BucketAction, &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: u.GetBucketId(),
				BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(3 * period), RateLimitStrategy: whole}}})
		}
		if err := st.Send(resp); err != nil {
			return nil
		}
	}
}

func startStatic(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(g, staticServer{})
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

// dialFleet dials n proxies to addr(i), closed when t ends. NoAssignment
// is DENY_ALL (docs/rlqs.md: the strict bound's choice).
func dialFleet(t *testing.T, n int, addr func(i int) string, expired *envoyrlqs.Expired) []*envoyrlqs.Proxy {
	t.Helper()
	ps := make([]*envoyrlqs.Proxy, n)
	for i := range ps {
		p, err := envoyrlqs.Dial(addr(i), envoyrlqs.Options{Domain: "edge", NoAssignment: envoyrlqs.DenyAll(), Expired: expired})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps[i] = p
	}
	return ps
}

func guard(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
