package edge

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// failing is a Store that cannot decide.
type failing struct{}

func (failing) Evaluate(context.Context, *sluice.Evaluation) error {
	return fmt.Errorf("test: dial: %w", sluice.FailedBeforeSend)
}

// counts records what a CountFunc is given.
type counts struct {
	mu  sync.Mutex
	got []string
}

func (c *counts) count(ids, classes []string, o sluice.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := strings.Join(ids, "+") + "=" + o.Kind.String()
	if classes != nil {
		got += " as " + strings.Join(classes, "+")
	}
	c.got = append(c.got, got)
}

func newCore(t *testing.T, store sluice.Store, opts Options) *Core {
	t.Helper()
	lim, err := sluice.New(store, []sluice.Policy{
		{ID: "p", Algorithm: sluice.FixedWindow, Limit: 2, Window: time.Minute},
		{ID: "q", Algorithm: sluice.FixedWindow, Limit: 4, Window: time.Minute},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func memStore(t *testing.T, clock *sluicetest.Clock) *memstore.Store {
	t.Helper()
	st, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestDecide walks a rule through each action, and finds each spend
// counted once, on the Core's counter and the context's.
func TestDecide(t *testing.T) {
	clock := sluicetest.NewClock()
	var core, ctxCount counts
	s := Subject{ID: "u0:x"}
	ctx := WithCount(context.Background(), ctxCount.count)
	steps := []struct {
		name   string
		store  sluice.Store
		mode   failure.Mode
		kinds  []Kind
		status int
	}{
		{"decided", memStore(t, clock), failure.Closed, []Kind{Admit, Admit, Limit}, 429},
		{"closed", failing{}, failure.Closed, []Kind{FailClosed}, 503},
		{"open", failing{}, failure.Open, []Kind{FailOpen}, 0},
		{"local: half of 2", failing{}, failure.Local, []Kind{Admit, Limit}, 429},
	}
	for _, step := range steps {
		c := newCore(t, step.store, Options{Count: core.count, Fallback: memStore(t, clock), LocalShare: 0.5, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
		r, err := c.Rule("Routes[0]", []string{"p", "q"}, 1, step.mode)
		if err != nil {
			t.Fatal(err)
		}
		var a Action
		var kinds []Kind
		for range step.kinds {
			a = c.Decide(ctx, r, s)
			kinds = append(kinds, a.Kind)
		}
		if diff := cmp.Diff(step.kinds, kinds); diff != "" {
			t.Errorf("%s: kinds diff (-want +got):\n%s", step.name, diff)
		}
		if a.Status != step.status || (a.Status != 0) != (a.RetryAfter > 0) {
			t.Errorf("%s: Status %d, RetryAfter %d, want %d and Retry-After with a refusal", step.name, a.Status, a.RetryAfter, step.status)
		}
		if r.Field != `"p";q=2;w=60, "q";q=4;w=60` || (a.LimitField() != "") != (step.name == "decided" || step.mode == failure.Local) {
			t.Errorf("%s: RateLimit-Policy %q, RateLimit %q, want both policies, and RateLimit when decided", step.name, r.Field, a.LimitField())
		}
		if step.status == 429 {
			if p := c.Problem(&a); p.Status != 429 || !cmp.Equal(p.ViolatedPolicies, []string{"p"}) {
				t.Errorf("%s: problem %+v, want 429 violating p", step.name, p)
			}
		}
	}
	// Every decision counted once per policy, the local ones by the
	// Limiter's (unavailable) outcome.
	want := []string{"p+q=allowed", "p+q=allowed", "p+q=denied", "p+q=unavailable", "p+q=unavailable", "p+q=unavailable", "p+q=unavailable"}
	for name, c := range map[string]*counts{"Options.Count": &core, "WithCount": &ctxCount} {
		if diff := cmp.Diff(want, c.got); diff != "" {
			t.Errorf("%s counted diff (-want +got):\n%s", name, diff)
		}
	}
}

// TestCountClasses: the counter is told, per policy, the class a
// decision counts as: the request's where the policy declares it, else
// default, and "" where the policy declares no classes; nothing (nil)
// when no policy of the request declares any. A class no policy declares
// is never passed on.
func TestCountClasses(t *testing.T) {
	lim, err := sluice.New(memStore(t, sluicetest.NewClock()), []sluice.Policy{
		{ID: "api", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute, Priorities: map[string]int{"critical": 100, "sheddable": 50}},
		{ID: "bulk", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute, Priorities: map[string]int{"batch": 10}},
		{ID: "plain", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got counts
	c, err := New(lim, Options{Count: got.count})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, req := range []sluice.Request{
		{Policy: "api", Subject: "s", Priority: "sheddable"},
		{Policy: "api", Subject: "s"},
		{Policies: []string{"api", "bulk", "plain"}, Subject: "s", Priority: "batch"},
		{Policy: "plain", Subject: "s", Priority: "critical"},
		{Policy: "api", Subject: "s", Priority: "nope"},
	} {
		c.Check(ctx, req)
	}
	c.With(lim).Check(ctx, sluice.Request{Policy: "api", Subject: "s", Priority: "critical"})
	want := []string{
		"api=allowed as sheddable",
		"api=allowed as default",
		"api+bulk+plain=allowed as default+batch+",
		"plain=allowed",
		"api=incompatible as default",
		"api=allowed as critical",
	}
	if diff := cmp.Diff(want, got.got); diff != "" {
		t.Errorf("counted diff (-want +got):\n%s", diff)
	}
}

func TestRuleErrors(t *testing.T) {
	c := newCore(t, memStore(t, sluicetest.NewClock()), Options{Prefix: "httplimit"})
	for _, tt := range []struct {
		policies []string
		cost     int64
		mode     failure.Mode
		want     string
	}{
		{[]string{"p"}, -1, 0, "httplimit: Default.Cost = -1: must not be negative; leave it 0 for 1"},
		{nil, 1, 0, "httplimit: Default.Policies = []: at least one policy ID is required"},
		{[]string{"nope"}, 1, 0, `httplimit: Default.Policies[0] = "nope": the limiter has no such policy; it has p, q`},
		{[]string{"p", "p"}, 1, 0, `httplimit: Default.Policies[1] = "p": is named twice`},
		{[]string{"p"}, 3, 0, `httplimit: Default.Cost = 3: must be at most the max cost of policy "p", 2`},
		{[]string{"p"}, 1, failure.Local, "httplimit: Default.FailureMode = local: is local, but Options.Fallback is nil"},
		{[]string{"p"}, 1, 9, "httplimit: Default.FailureMode = FailureMode(9): must be one of closed, open, local"},
	} {
		if _, err := c.Rule("Default", tt.policies, tt.cost, tt.mode); err == nil || err.Error() != tt.want {
			t.Errorf("Rule(%q, %d, %v) = %v, want %q", tt.policies, tt.cost, tt.mode, err, tt.want)
		}
	}
}

// TestLogThrottle: warnings go out ten a second on the Core's clock, with
// the count held back; other levels are never held.
func TestLogThrottle(t *testing.T) {
	clock := sluicetest.NewClock()
	var buf bytes.Buffer
	c := newCore(t, memStore(t, clock), Options{Clock: clock, Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := context.Background()
	for range 10 {
		c.Log(ctx, slog.LevelWarn, "one")
	}
	c.Log(ctx, slog.LevelWarn, "held")
	c.Log(ctx, slog.LevelWarn, "held")
	c.Log(ctx, slog.LevelInfo, "info")
	clock.Advance(time.Second)
	c.Log(ctx, slog.LevelWarn, "two")
	got := buf.String()
	if strings.Contains(got, "held") || !strings.Contains(got, "msg=one") || !strings.Contains(got, "msg=info") || !strings.Contains(got, "msg=two suppressed_since_last=2") {
		t.Errorf("logs:\n%s\nwant one, info, and two with suppressed_since_last=2", got)
	}
}

// TestDecideRequestBuildsNoField finds a decision of the core costing at
// most one allocation more than the Limiter's own (the lazy deadline's):
// the RateLimit field is built only when an edge asks for it
// (Action.LimitField), as the Envoy service and the check API never do.
func TestDecideRequestBuildsNoField(t *testing.T) {
	clock := sluicetest.NewClock()
	c := newCore(t, memStore(t, clock), Options{Clock: clock})
	req := sluice.Request{Op: sluice.Peek, Policy: "p", Subject: "u0:x"}
	ctx := context.Background()
	lim := testing.AllocsPerRun(100, func() { c.Limiter().Check(ctx, req) })
	var a Action
	core := testing.AllocsPerRun(100, func() { a = c.DecideRequest(ctx, req, failure.Closed) })
	if core > lim+1 {
		t.Errorf("DecideRequest: %v allocations a decision, the Limiter's own %v: want at most one more", core, lim)
	}
	if a.Kind != Admit || !strings.HasPrefix(a.LimitField(), `"p";r=2;`) {
		t.Errorf("DecideRequest: %s, RateLimit %q; want admitted, with the field when asked", a.Kind, a.LimitField())
	}
}
