package rls_test

import (
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/sluicetest"
)

// testCostAboveCapacity: a spend above what a rule can ever admit is
// OVER_LIMIT and spends nothing, decided by the store as at every edge
// (it refuses the cost before it reads any state), never an error
// Envoy's failure_mode_deny: false would admit. The check it is decided
// in is denied whole: a descriptor of the same subject and cost in it is
// OVER_LIMIT too; one of another cost is decided in its own check, in
// request order, and once the subject is denied the rest only peek, as
// after any denial.
func testCostAboveCapacity(t *testing.T, h *harness) {
	hits := func(n uint32, r *rlspb.RateLimitRequest) *rlspb.RateLimitRequest { r.HitsAddend = n; return r }
	own := func(n uint64, kv ...string) *rlspb.RateLimitRequest {
		r := req(d(kv...))
		r.Descriptors[0].HitsAddend = wrapperspb.UInt64(n)
		return r
	}
	// user (10/HOUR) and plan=free,user (1/HOUR) name the same subject.
	twoFirstBig := req(d("plan", "free", "user", "c3"), d("user", "c3"))
	twoFirstBig.Descriptors[0].HitsAddend = wrapperspb.UInt64(2)
	twoLastBig := req(d("user", "c4"), d("plan", "free", "user", "c4"))
	twoLastBig.Descriptors[1].HitsAddend = wrapperspb.UInt64(2)
	run(t, h, []step{
		{"6 of a 5 a day", own(6, "api", "c1"), "OVER_LIMIT", []st{{"OVER_LIMIT", "5/DAY", 0}}},
		{"nothing was spent", req(d("api", "c1")), "OK", []st{{"OK", "5/DAY", 4}}},
		{"2 of 1 beside 2 of 10, one check", hits(2, req(d("user", "c2"), d("plan", "free", "user", "c2"))), "OVER_LIMIT", []st{{"OVER_LIMIT", "10/HOUR", 0}, {"OVER_LIMIT", "1/HOUR", 0}}},
		{"nothing spent on the subject", req(d("user", "c2")), "OK", []st{{"OK", "10/HOUR", 9}}},
		{"2 of 1 first: the rest only peeks", twoFirstBig, "OVER_LIMIT", []st{{"OVER_LIMIT", "1/HOUR", 0}, {"OK", "10/HOUR", 10}}},
		{"2 of 1 last: the first is spent, as before any denial", twoLastBig, "OVER_LIMIT", []st{{"OK", "10/HOUR", 9}, {"OVER_LIMIT", "1/HOUR", 0}}},
	})
}

func TestCostAboveCapacityMemstore(t *testing.T) { testCostAboveCapacity(t, memHarness(t)) }

func TestCostAboveCapacityRedis(t *testing.T) {
	testCostAboveCapacity(t, start(t, redisStore(t, redistest.Standalone(t), sluicetest.NewClock()), testRules))
}
