package envoyrlqs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
)

var api = map[string]string{"route": "api", "tenant": "a"}

// guard bounds a test that waits on a server's answers.
func guard(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, s *server, opts envoyrlqs.Options) *envoyrlqs.Proxy {
	t.Helper()
	if opts.Domain == "" {
		opts.Domain = "edge"
	}
	p, err := envoyrlqs.Dial(s.addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// admit sends n requests of id and returns how many were allowed.
func admit(p *envoyrlqs.Proxy, id map[string]string, n int) int {
	allowed := 0
	for range n {
		if p.Admit(id) {
			allowed++
		}
	}
	return allowed
}

// step is one step of a bucket's story: advance the clock, push actions,
// then admit requests and check what was allowed and where the bucket
// stands.
type step struct {
	advance time.Duration
	push    *rlqspb.RateLimitQuotaResponse_BucketAction
	admit   int
	allowed int
	phase   envoyrlqs.Phase // checked when set
	kind    envoyrlqs.EventKind
}

var tb = envoyrlqs.TokenBucket

// TestTokenBucket plays each row's story on one bucket: the first request
// is decided by no_assignment_behavior and answered with first (TTL ttl),
// then the steps run.
func TestTokenBucket(t *testing.T) {
	hour := time.Hour
	fallback := &envoyrlqs.Expired{Fallback: tb(2, 1, time.Minute), Timeout: 3 * time.Second}
	rows := []struct {
		name  string
		opts  envoyrlqs.Options
		first *typev3.RateLimitStrategy
		ttl   time.Duration
		steps []step
	}{
		{"a new token bucket starts full", envoyrlqs.Options{}, tb(3, 1, time.Minute), hour,
			[]step{{admit: 4, allowed: 3, phase: envoyrlqs.Assignment}}},
		{"it fills tokens_per_fill per fill_interval, continuously", envoyrlqs.Options{}, tb(5, 2, time.Second), hour,
			[]step{{admit: 5, allowed: 5}, {advance: time.Second, admit: 3, allowed: 2}, {advance: 500 * time.Millisecond, admit: 2, allowed: 1}}},
		// sluice sends tokens_per_fill above max_tokens (a share written
		// as tokens every F s, F up to 60): Envoy's AtomicTokenBucketImpl
		// refills at tokens_per_fill / fill_interval a second, capped at
		// max_tokens, never a whole fill at once (docs/rlqs.md).
		{"tokens_per_fill above max_tokens: the rate, capped at max_tokens", envoyrlqs.Options{}, tb(2, 10, 5*time.Second), hour,
			[]step{{admit: 3, allowed: 2}, {advance: time.Second, admit: 3, allowed: 2}, {advance: 500 * time.Millisecond, admit: 2, allowed: 1},
				{advance: 10 * time.Second, admit: 5, allowed: 2}}},
		{"fill_interval is read in whole seconds", envoyrlqs.Options{}, tb(1, 1, 1500*time.Millisecond), hour,
			[]step{{admit: 1, allowed: 1}, {advance: time.Second, admit: 2, allowed: 1}}},
		{"a fill_interval under 1 s admits all", envoyrlqs.Options{}, tb(1, 1, 500*time.Millisecond), hour,
			[]step{{admit: 10, allowed: 10}}},
		{"a changed token bucket keeps its fill ratio", envoyrlqs.Options{}, tb(10, 1, time.Minute), hour,
			[]step{{admit: 5, allowed: 5}, {push: assignment(api, tb(20, 1, time.Minute), hour), admit: 11, allowed: 10, kind: envoyrlqs.Assigned}}},
		{"the same token bucket only restarts its TTL", envoyrlqs.Options{}, tb(10, 1, time.Second), 2 * time.Second,
			[]step{{admit: 10, allowed: 10}, {advance: time.Second, push: assignment(api, tb(10, 1, time.Second), 2*time.Second), kind: envoyrlqs.Refreshed},
				{advance: 1500 * time.Millisecond, admit: 3, allowed: 2, phase: envoyrlqs.Assignment}}},
		{"fill_interval's seconds are not compared", envoyrlqs.Options{}, tb(10, 1, time.Second), hour,
			[]step{{admit: 10, allowed: 10}, {push: assignment(api, tb(10, 1, 2*time.Second), hour), kind: envoyrlqs.Refreshed},
				{advance: time.Second, admit: 2, allowed: 1}}},
		{"the TTL is read in whole seconds", envoyrlqs.Options{}, envoyrlqs.DenyAll(), 2900 * time.Millisecond,
			[]step{{admit: 1, allowed: 0}, {advance: 2 * time.Second, admit: 1, allowed: 1, phase: envoyrlqs.Unassigned}}},
		{"an expiry without expired_assignment_behavior: no assignment", envoyrlqs.Options{}, tb(1, 1, time.Minute), 2 * time.Second,
			[]step{{admit: 2, allowed: 1}, {advance: 2 * time.Second, admit: 3, allowed: 3, phase: envoyrlqs.Unassigned, kind: envoyrlqs.AssignmentExpired}}},
		{"an expiry to the fallback, at the old fill ratio, until its timeout", envoyrlqs.Options{Expired: fallback}, tb(4, 1, time.Minute), 2 * time.Second,
			[]step{{admit: 2, allowed: 2}, {advance: 2 * time.Second, admit: 2, allowed: 1, phase: envoyrlqs.Fallback},
				{advance: 3 * time.Second, admit: 3, allowed: 3, phase: envoyrlqs.Unassigned, kind: envoyrlqs.FallbackEnded}}},
		{"TTL 0 expires at once", envoyrlqs.Options{Expired: fallback}, tb(5, 1, time.Minute), hour,
			[]step{{push: assignment(api, tb(5, 1, time.Minute), 0), admit: 3, allowed: 2, phase: envoyrlqs.Fallback}}},
		{"DENY_ALL, then ALLOW_ALL", envoyrlqs.Options{}, envoyrlqs.DenyAll(), hour,
			[]step{{admit: 3, allowed: 0}, {push: assignment(api, envoyrlqs.AllowAll(), hour), admit: 3, allowed: 3}}},
		{"a token bucket after a blanket rule starts full", envoyrlqs.Options{}, tb(2, 1, time.Minute), hour,
			[]step{{admit: 2, allowed: 2}, {push: assignment(api, envoyrlqs.DenyAll(), hour), admit: 1, allowed: 0},
				{push: assignment(api, tb(2, 1, time.Minute), hour), admit: 3, allowed: 2}}},
		{"requests_per_time_unit is skipped", envoyrlqs.Options{}, tb(1, 1, time.Minute), hour,
			[]step{{admit: 1, allowed: 1}, {push: assignment(api, rptu(), hour), admit: 1, allowed: 0, kind: envoyrlqs.Ignored}}},
		{"abandon_action erases the bucket", envoyrlqs.Options{}, envoyrlqs.DenyAll(), hour,
			[]step{{push: abandon(api), phase: envoyrlqs.Unknown, kind: envoyrlqs.Abandoned}}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			ctx := guard(t)
			s := startServer(t)
			s.assign(api, row.first, row.ttl)
			p := dial(t, s, row.opts)
			if !p.Admit(api) {
				t.Fatalf("first Admit = false, want true (ALLOW_ALL before the first assignment)")
			}
			if err := p.Await(ctx); err != nil {
				t.Fatal(err)
			}
			for i, st := range row.steps {
				runStep(ctx, t, s, p, i, st)
			}
		})
	}
}

func runStep(ctx context.Context, t *testing.T, s *server, p *envoyrlqs.Proxy, i int, st step) {
	t.Helper()
	p.Advance(st.advance)
	if st.push != nil {
		s.send(ctx, t, p, st.push)
	}
	if got := admit(p, api, st.admit); got != st.allowed {
		t.Errorf("step %d: %d Admits allowed %d, want %d (state %+v)", i, st.admit, got, st.allowed, p.State(api))
	}
	if st.phase != "" {
		if got := p.State(api).Phase; got != st.phase {
			t.Errorf("step %d: phase %q, want %q", i, got, st.phase)
		}
	}
	if st.kind != "" {
		evs := p.Events()
		if got := evs[len(evs)-1].Kind; !hasKind(evs, st.kind) {
			t.Errorf("step %d: last event %q, want a %q event", i, got, st.kind)
		}
	}
}

func hasKind(evs []envoyrlqs.Event, k envoyrlqs.EventKind) bool {
	for _, e := range evs {
		if e.Kind == k {
			return true
		}
	}
	return false
}

func rptu() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 1, TimeUnit: typev3.RateLimitUnit_SECOND}}}
}

// TestNoAssignmentDenyAll: a DENY_ALL no_assignment_behavior denies a new
// bucket's first request, which is still reported at once.
func TestNoAssignmentDenyAll(t *testing.T) {
	ctx := guard(t)
	s := startServer(t)
	p := dial(t, s, envoyrlqs.Options{NoAssignment: envoyrlqs.DenyAll()})
	if p.Admit(api) {
		t.Fatal("first Admit = true, want false under a DENY_ALL no_assignment_behavior")
	}
	r := s.awaitReports(ctx, t, 1)[0].GetBucketQuotaUsages()[0]
	if r.GetNumRequestsAllowed() != 0 || r.GetNumRequestsDenied() != 1 {
		t.Errorf("first report allowed=%d denied=%d, want 0 and 1", r.GetNumRequestsAllowed(), r.GetNumRequestsDenied())
	}
}

// TestDialRefuses: options Envoy would not run with are refused.
func TestDialRefuses(t *testing.T) {
	for name, opts := range map[string]envoyrlqs.Options{
		"no domain":                          {},
		"token bucket before any assignment": {Domain: "d", NoAssignment: tb(1, 1, time.Second)},
		"fallback unset":                     {Domain: "d", Expired: &envoyrlqs.Expired{}},
		"sub-second report period":           {Domain: "d", ReportPeriod: 1500 * time.Millisecond},
	} {
		if p, err := envoyrlqs.Dial("127.0.0.1:1", opts); err == nil {
			_ = p.Close()
			t.Errorf("%s: Dial = nil error, want one", name)
		}
	}
}

var errEnded = envoyrlqs.ErrStreamEnded

// isEnded reports whether err says a stream ended with reports unanswered.
func isEnded(err error) bool { return errors.Is(err, errEnded) }
