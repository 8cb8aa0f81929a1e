package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// reasonPolicies have a rule for each refusal TestCheckAPIReasons asks
// for: a max_cost, an algorithm that cannot refund, one that cannot book,
// priority classes.
var reasonPolicies = []sluice.Policy{
	{ID: "fw", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute, MaxCost: 5, Priorities: map[string]int{"critical": 100, "sheddable": 50}},
	{ID: "sw", Algorithm: sluice.SlidingWindow, Limit: 10, Window: time.Minute},
}

// TestCheckAPIReasons: a request the policies refuse answers the status
// check-api.md and the OpenAPI document give (an unknown priority class
// 422, not 400) with a reason in the library's words, the same on both
// stores: no store package's prefix ("memstore:", "redisstore:"), none of
// the library's own ("sluice:"), no script error code (SLUICE_ARGS).
func TestCheckAPIReasons(t *testing.T) {
	cases := []struct {
		body string
		code int
		want string
	}{
		{`{"policy":"fw","subject":"a","priority":"no-such-class"}`, 422, `invalid request: priority = "no-such-class": must be empty or a class a policy declares: critical, sheddable`},
		{`{"policy":"fw","subject":"a","op":"settle","cost":3,"evaluation_id":"never-estimated"}`, 400, "invalid request: no estimate to settle under this evaluation id"},
		{`{"policy":"fw","subject":"a","op":"book"}`, 400, `policy "fw": invalid request: a book on fixed_window: only gcra and token_bucket have a future slot to book`},
		{`{"policy":"fw","subject":"a","cost":7}`, 422, `policy "fw": cost = 7: cost above policy maximum 5`},
		{`{"policy":"sw","subject":"a","cost":1,"refund":true}`, 422, `policy "sw": refund not supported by sliding_window`},
	}
	reasons := map[string][]string{}
	for _, st := range []struct {
		name  string
		store func(t *testing.T) sluice.Store
	}{
		{"memory", func(t *testing.T) sluice.Store {
			ms, err := memstore.New(memstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ms.Close() })
			return ms
		}},
		{"redis", func(t *testing.T) sluice.Store {
			rs, err := redisstore.New(redistest.Standalone(t).Client(), redisstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return rs
		}},
	} {
		t.Run(st.name, func(t *testing.T) {
			f := newFixtureOn(t, &recordingStore{Store: st.store(t)}, sluicetest.NewClock(), reasonPolicies, server.Options{})
			for _, c := range cases {
				resp, a := f.post(t, c.body)
				if resp.StatusCode != c.code || a.Outcome != "incompatible" || !strings.HasPrefix(a.Reason, c.want) {
					t.Errorf("POST %s = %d %q, want %d with a reason beginning %q", c.body, resp.StatusCode, a.Reason, c.code, c.want)
				}
				for _, internal := range []string{"memstore", "redisstore", "sluice:", "SLUICE_"} {
					if strings.Contains(a.Reason, internal) {
						t.Errorf("POST %s: reason %q carries %q", c.body, a.Reason, internal)
					}
				}
				reasons[st.name] = append(reasons[st.name], a.Reason)
			}
		})
	}
	if m, r := fmt.Sprint(reasons["memory"]), fmt.Sprint(reasons["redis"]); m != r {
		t.Errorf("reasons differ between the stores:\nmemory %s\nredis  %s", m, r)
	}
}
