package rls_test

import (
	"strings"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/sluicetest"
)

// priorityRules: 10 an hour per tenant, half of it held back from
// sheddable traffic; per tenant and model, 10 an hour of which the
// default class (a request naming none) may use 60 %; per tenant on the
// search API, 4 an hour, half held back from sheddable; and at most 4
// streams in flight per user, sheddable ones at most 2.
const priorityRules = `
domain: shop
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 10
      sluice_priorities: { critical: 100%, sheddable: 50% }
  - key: model
    rate_limit:
      unit: hour
      requests_per_unit: 10
      sluice_priorities: { critical: 100%, default: 60% }
  - key: api
    value: search
    descriptors:
      - key: tenant
        rate_limit:
          unit: hour
          requests_per_unit: 4
          sluice_priorities: { sheddable: 50% }
  - key: user
    descriptors:
      - key: request_id
        rate_limit:
          sluice_in_flight: { limit: 4, lease_ttl: 1m }
          sluice_priorities: { sheddable: 50% }
`

// classed is a descriptor of kv with a sluice_priority entry of class
// appended (none when class is "-").
func classed(class string, kv ...string) *commonpb.RateLimitDescriptor {
	if class != "-" {
		kv = append(kv, "sluice_priority", class)
	}
	return d(kv...)
}

// testPriorityShares: on one budget, sheddable requests are denied
// while what is left is inside the reserved half, and critical ones are
// admitted up to the whole limit, whichever comes first; the remaining
// a class sees is what it can still use.
func testPriorityShares(t *testing.T, h *harness) {
	shed, crit := req(classed("sheddable", "tenant", "t1")), req(classed("critical", "tenant", "t1"))
	var steps []step
	for i := range 5 {
		steps = append(steps, step{"sheddable " + itoa(uint32(i+1)), shed, "OK", []st{{"OK", "10/HOUR", uint32(4 - i)}}})
	}
	steps = append(steps, step{"the 6th sheddable: the rest is reserved", shed, "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}})
	for i := range 5 {
		steps = append(steps, step{"critical " + itoa(uint32(i+1)), crit, "OK", []st{{"OK", "10/HOUR", uint32(4 - i)}}})
	}
	steps = append(steps,
		step{"the 11th: over for critical too", crit, "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		step{"sheddable still over", shed, "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}})
	run(t, h, steps)

	// Critical first: once what is left is inside the reserve, sheddable
	// gets nothing, though the budget is not spent.
	shed2, crit2 := req(classed("sheddable", "tenant", "t2")), req(classed("critical", "tenant", "t2"))
	for range 6 {
		h.ask(t, crit2)
	}
	run(t, h, []step{
		{"sheddable with 4 of 10 left", shed2, "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		{"critical still admitted", crit2, "OK", []st{{"OK", "10/HOUR", 3}}},
	})

	// A cost above what the class may ever use is a denial, not an error
	// Envoy's failure_mode_deny: false would admit.
	big := func(class string) *rlspb.RateLimitRequest {
		r := req(classed(class, "tenant", "t3"))
		r.Descriptors[0].HitsAddend = wrapperspb.UInt64(6)
		return r
	}
	run(t, h, []step{
		{"sheddable asking 6 of its 5", big("sheddable"), "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		{"critical asking 6", big("critical"), "OK", []st{{"OK", "10/HOUR", 4}}},
	})
}

// testPriorityEntryRemoved: the sluice_priority entry is removed before
// matching, wherever it is: the rule matches with and without it and
// spends the same subject's budget.
func testPriorityEntryRemoved(t *testing.T, h *harness) {
	run(t, h, []step{
		{"without the entry", req(d("tenant", "t4")), "OK", []st{{"OK", "10/HOUR", 9}}},
		{"with it, last", req(classed("critical", "tenant", "t4")), "OK", []st{{"OK", "10/HOUR", 8}}},
		{"with it, first", req(d("sluice_priority", "critical", "tenant", "t4")), "OK", []st{{"OK", "10/HOUR", 7}}},
		{"nested, between the levels", req(d("api", "search", "sluice_priority", "sheddable", "tenant", "t4")), "OK", []st{{"OK", "4/HOUR", 1}}},
		{"the nested rule without it", req(d("api", "search", "tenant", "t4")), "OK", []st{{"OK", "4/HOUR", 2}}},
	})
	twice := d("tenant", "t4", "sluice_priority", "critical", "sluice_priority", "sheddable")
	if _, err := h.client.ShouldRateLimit(t.Context(), req(twice)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("two classes in one descriptor = %v, want InvalidArgument", err)
	}
}

// testPriorityUnknownClass: a class the rule does not declare is decided
// as the default class (here 60 % of the model's budget), never as an
// error or with the whole budget; it is counted under the rule, and the
// value is no label. "default" and an empty value are the default class
// and not counted.
func testPriorityUnknownClass(t *testing.T, h *harness) {
	forged := req(classed("platinum", "model", "m1"))
	var steps []step
	for i := range 6 {
		steps = append(steps, step{"an unknown class " + itoa(uint32(i+1)), forged, "OK", []st{{"OK", "10/HOUR", uint32(5 - i)}}})
	}
	steps = append(steps,
		step{"the 7th: over, as the default class", forged, "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		step{"default, named", req(classed("default", "model", "m1")), "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		step{"empty", req(classed("", "model", "m1")), "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		step{"critical: the reserve", req(classed("critical", "model", "m1")), "OK", []st{{"OK", "10/HOUR", 3}}},
		// A rule that declares classes, but not this one: sheddable's
		// share applies only to sheddable.
		step{"an unknown class on the tenant rule", req(classed("critical-ish", "tenant", "t5")), "OK", []st{{"OK", "10/HOUR", 9}}},
	)
	run(t, h, steps)
	if n := sumLabel(t, h.reg, "sluice_envoy_unknown_priority_total", "rule", "shop.model"); n != 7 {
		t.Errorf("sluice_envoy_unknown_priority_total{rule=shop.model} = %v, want 7", n)
	}
	if n := sumLabel(t, h.reg, "sluice_envoy_unknown_priority_total", "rule", "shop.tenant"); n != 1 {
		t.Errorf("sluice_envoy_unknown_priority_total{rule=shop.tenant} = %v, want 1", n)
	}
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if strings.Contains(l.GetValue(), "platinum") || strings.Contains(l.GetValue(), "critical-ish") {
					t.Errorf("%s has the label %s=%q: a class from the client", mf.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// testPriorityGroups: two descriptors of one subject (the tenant) and
// cost, of different classes, are decided in separate checks, each as
// its class: the critical one on the tenant's budget is spent while the
// sheddable one on the search API is over. In one check (all or
// nothing) the tenant's would not have been spent, and as one class the
// search API's would not have been over. Request order and "once a
// subject is denied, the rest only check" stay.
func testPriorityGroups(t *testing.T, h *harness) {
	both := req(classed("critical", "tenant", "t6"), classed("sheddable", "api", "search", "tenant", "t6"))
	reversed := req(classed("sheddable", "api", "search", "tenant", "t6"), classed("critical", "tenant", "t6"))
	run(t, h, []step{
		{"first", both, "OK", []st{{"OK", "10/HOUR", 9}, {"OK", "4/HOUR", 1}}},
		{"second: sheddable's 2 of 4 spent", both, "OK", []st{{"OK", "10/HOUR", 8}, {"OK", "4/HOUR", 0}}},
		{"third: critical spent, sheddable over", both, "OVER_LIMIT", []st{{"OK", "10/HOUR", 7}, {"OVER_LIMIT", "4/HOUR", 0}}},
		{"sheddable first: the subject is denied, critical only checks", reversed, "OVER_LIMIT", []st{{"OVER_LIMIT", "4/HOUR", 0}, {"OK", "10/HOUR", 7}}},
		{"nothing was spent on the tenant", req(classed("critical", "tenant", "t6")), "OK", []st{{"OK", "10/HOUR", 6}}},
		{"the search API as critical: the reserve is there", req(classed("critical", "api", "search", "tenant", "t6")), "OK", []st{{"OK", "4/HOUR", 1}}},
	})
}

// testPriorityInFlight: on an in-flight limit, sheddable streams hold at
// most half the slots (a sheddable stream starts while fewer than 2 are
// held, whatever their class) and critical ones the rest; a stream-done
// call gives a slot back whatever its class.
func testPriorityInFlight(t *testing.T, h *harness) {
	stream := func(class, id string, done bool) *rlspb.RateLimitRequest {
		desc := classed(class, "user", "u1", "request_id", id)
		if done {
			desc.IsNegativeHits = true
		}
		return req(desc)
	}
	run(t, h, []step{
		{"sheddable 1", stream("sheddable", "r1", false), "OK", []st{{"OK", "4/UNKNOWN", 1}}},
		{"sheddable 2", stream("sheddable", "r2", false), "OK", []st{{"OK", "4/UNKNOWN", 0}}},
		{"sheddable 3: over its half", stream("sheddable", "r3", false), "OVER_LIMIT", []st{{"OVER_LIMIT", "4/UNKNOWN", 0}}},
		{"critical 1", stream("critical", "r4", false), "OK", []st{{"OK", "4/UNKNOWN", 1}}},
		{"critical 2", stream("critical", "r5", false), "OK", []st{{"OK", "4/UNKNOWN", 0}}},
		{"critical 3: every slot held", stream("critical", "r6", false), "OVER_LIMIT", []st{{"OVER_LIMIT", "4/UNKNOWN", 0}}},
		{"r1 done, without its class", stream("-", "r1", true), "OK", []st{{"OK", "4/UNKNOWN", 1}}},
		{"sheddable: 3 held, its half taken", stream("sheddable", "r7", false), "OVER_LIMIT", []st{{"OVER_LIMIT", "4/UNKNOWN", 0}}},
		{"r4 done, with its class", stream("critical", "r4", true), "OK", []st{{"OK", "4/UNKNOWN", 2}}},
		{"r5 done", stream("-", "r5", true), "OK", []st{{"OK", "4/UNKNOWN", 3}}},
		{"sheddable again: 1 held", stream("sheddable", "r7", false), "OK", []st{{"OK", "4/UNKNOWN", 0}}},
	})
}

var priorityTests = []struct {
	name string
	fn   func(*testing.T, *harness)
}{
	{"shares", testPriorityShares},
	{"entry_removed", testPriorityEntryRemoved},
	{"unknown_class", testPriorityUnknownClass},
	{"groups", testPriorityGroups},
	{"in_flight", testPriorityInFlight},
}

func TestPrioritiesMemstore(t *testing.T) {
	for _, tc := range priorityTests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, start(t, memStore(t), priorityRules))
		})
	}
}

func TestPrioritiesRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, tc := range priorityTests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, start(t, redisStore(t, srv, sluicetest.NewClock()), priorityRules))
		})
	}
}

// TestPriorityTenantPlanCost: a tenant plan (sluice.Override) lowering a
// rule's limit lowers what one request may ever spend, and its class's
// share of it: a cost above either is OVER_LIMIT, never an error Envoy's
// failure_mode_deny: false would admit.
func TestPriorityTenantPlanCost(t *testing.T) {
	ms := memStore(t)
	h := startWith(t, ms, priorityRules, func(st *rls.State) {
		policy, subj, _, err := st.OverrideSubject("shop", []rules.Entry{{Key: "tenant", Value: "t7"}})
		if err != nil {
			t.Fatal(err)
		}
		lim, err := sluice.New(ms, st.Rules.Policies(), sluice.Options{Overrides: []sluice.Override{{Policy: policy, Subject: subj, Limit: 4}}})
		if err != nil {
			t.Fatal(err)
		}
		st.Limiter = lim
	})
	cost := func(class string, n uint64) *rlspb.RateLimitRequest {
		r := req(classed(class, "tenant", "t7"))
		r.Descriptors[0].HitsAddend = wrapperspb.UInt64(n)
		return r
	}
	run(t, h, []step{
		{"sheddable asking 3 of the plan's 4: its share is 2", cost("sheddable", 3), "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		{"critical asking 5 of the plan's 4", cost("critical", 5), "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		{"critical asking 4", cost("critical", 4), "OK", []st{{"OK", "10/HOUR", 0}}},
	})
}
