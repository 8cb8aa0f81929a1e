package rls_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// quotaRules are the limits of envoyproxy/ratelimit's quota_mode tests
// (test/service/ratelimit_test.go, #1045 and #1059): "regular" 5 a
// minute, "quota" 3 a minute in quota_mode, and two quota_mode limits,
// "quota1" 5 and "quota2" 3 a minute.
const quotaRules = `
domain: quota-domain
descriptors:
  - key: regular
    value: limit
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: quota
    value: limit
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: quota1
    value: limit
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: quota2
    value: limit
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 3 }
`

// TestQuotaModeCompatibility ports envoyproxy/ratelimit's quota_mode
// service tests. Theirs hand each descriptor's status to the service
// from a mocked cache; here the store is brought to that state by
// spending first (spend), then the request of their test is asked, and
// the overall code and each descriptor's code must be theirs. Their
// tests of the global QUOTA_MODE and SHADOW_MODE settings
// (TestServiceGlobalQuotaMode, TestServiceQuotaModeWithShadowMode,
// TestServiceMixedModeWithShadowMode) are not ported: sluice has no
// global mode; the first is TestServiceQuotaModeOnlyAllOverTheLimit with
// quota_mode on each rule, ported below.
func TestQuotaModeCompatibility(t *testing.T) {
	t.Run("memstore", func(t *testing.T) { testQuotaModeCompatibility(t, memQuota) })
	t.Run("redis", func(t *testing.T) { testQuotaModeCompatibility(t, redisQuota(redistest.Standalone(t))) })
}

// quotaStore builds a store on clock for one harness.
type quotaStore func(t *testing.T, clock *sluicetest.Clock) sluice.Store

func memQuota(t *testing.T, clock *sluicetest.Clock) sluice.Store {
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	return ms
}

// redisQuota builds stores on srv under a key prefix of their own, so
// the cases' counters never meet.
func redisQuota(srv *redistest.Server) quotaStore {
	n := 0
	return func(t *testing.T, clock *sluicetest.Clock) sluice.Store {
		n++
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: askTimeout, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		st, err := redisstore.New(c, redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour, Timeout: -1, Prefix: "quota" + strconv.Itoa(n) + ":"})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
}

func testQuotaModeCompatibility(t *testing.T, newStore quotaStore) {
	for _, tc := range []struct {
		name    string // their test
		spend   map[string]int
		ask     []string // the value "limit" of each key, in order
		overall string
		codes   []string
	}{
		{"TestServicePerDescriptorQuotaMode", map[string]int{"regular": 5}, []string{"regular", "quota"}, "OVER_LIMIT", []string{"OVER_LIMIT", "OK"}},
		{"TestServiceMixedPerDescriptorModes", map[string]int{"quota": 3}, []string{"regular", "quota"}, "OVER_LIMIT", []string{"OK", "OVER_LIMIT"}},
		{"TestServiceMixedPerDescriptorModesUnderLimit", nil, []string{"regular", "quota"}, "OK", []string{"OK", "OK"}},
		{"TestServiceQuotaModeOnlyAllOverTheLimit", map[string]int{"quota1": 5, "quota2": 3}, []string{"quota1", "quota2"}, "OVER_LIMIT", []string{"OVER_LIMIT", "OVER_LIMIT"}},
		{"TestServiceQuotaModeOnlySomeOverTheLimit", map[string]int{"quota1": 5}, []string{"quota1", "quota2"}, "OK", []string{"OVER_LIMIT", "OK"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := quotaHarnessOn(t, newStore, quotaRules, false)
			for key, n := range tc.spend {
				for range n {
					h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d(key, "limit"))})
				}
			}
			var descs []*commonpb.RateLimitDescriptor
			for _, key := range tc.ask {
				descs = append(descs, d(key, "limit"))
			}
			overall, got, _ := h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: descs, HitsAddend: 1})
			var codes []string
			for _, s := range got {
				codes = append(codes, s.Code)
			}
			if overall != tc.overall || !equal(codes, tc.codes) {
				t.Errorf("ShouldRateLimit = %s %v, want %s %v", overall, codes, tc.overall, tc.codes)
			}
		})
	}
	// A quota_mode descriptor over its limit stops nothing, so the other
	// quota was spent; a request over a regular limit spends no quota.
	h, _ := quotaHarnessOn(t, newStore, quotaRules, false)
	for range 5 {
		h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("quota1", "limit"))})
	}
	h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("quota1", "limit"), d("quota2", "limit"))})
	run(t, h, []step{{"quota2 was spent beside quota1 over", &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("quota2", "limit"))}, "OK", []st{{"OK", "3/MINUTE", 1}}}})
	for range 5 {
		h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("regular", "limit"))})
	}
	h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("regular", "limit"), d("quota", "limit"))})
	run(t, h, []step{{"no quota spent beside a regular limit over", &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("quota", "limit"))}, "OK", []st{{"OK", "3/MINUTE", 2}}}})
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// quotaHarness serves rules on memstore at a fake clock, sending dynamic
// metadata when metadata is set.
func quotaHarness(t *testing.T, rules string, metadata bool) *harness {
	t.Helper()
	h, _ := quotaHarnessClock(t, rules, metadata)
	return h
}

func quotaHarnessClock(t *testing.T, rules string, metadata bool) (*harness, *sluicetest.Clock) {
	t.Helper()
	return quotaHarnessOn(t, memQuota, rules, metadata)
}

// quotaHarnessOn is quotaHarnessClock on a store newStore builds.
func quotaHarnessOn(t *testing.T, newStore quotaStore, rules string, metadata bool) (*harness, *sluicetest.Clock) {
	t.Helper()
	clock := sluicetest.NewClock()
	return startWith(t, newStore(t, clock), rules, func(st *rls.State) { st.ResponseMetadata = metadata }), clock
}

// TestResponseMetadataCompatibility ports envoyproxy/ratelimit's
// dynamic metadata tests (#1112), which run with QUOTA_MODE and
// RESPONSE_DYNAMIC_METADATA set: here quota_mode is on each rule and
// envoy.response_metadata (State.ResponseMetadata) on. The metadata of
// the descriptors that passed is merged, the first value of a name
// winning.
func TestResponseMetadataCompatibility(t *testing.T) {
	rules := func(second string) string {
		return `
domain: quota-domain
descriptors:
  - key: regular
    value: limit
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
    metadata: { name: service_1 }
  - key: quota
    value: limit
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
    metadata: { ` + second + `: service_2 }
`
	}
	for _, tc := range []struct {
		name, second string
		spendQuota   int
		want         map[string]string
	}{
		{"TestMetadataReturnedForPassedDescriptors", "name", 5, map[string]string{"name": "service_1"}},
		{"TestMetadataReturnedForAllPassedDescriptors", "some_other_name", 0, map[string]string{"name": "service_1", "some_other_name": "service_2"}},
		{"TestOverlappingMetadataReturnsTheFirstValue", "name", 0, map[string]string{"name": "service_1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := quotaHarness(t, rules(tc.second), true)
			for range tc.spendQuota {
				h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("quota", "limit"))})
			}
			overall, _, resp := h.ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("regular", "limit"), d("quota", "limit")), HitsAddend: 1})
			if overall != "OK" {
				t.Fatalf("ShouldRateLimit = %s, want OK", overall)
			}
			md := resp.GetDynamicMetadata().GetFields()
			if md["domain"].GetStringValue() != "quota-domain" || len(md["descriptors"].GetListValue().GetValues()) != 2 || md["hitsAddend"].GetNumberValue() != 1 {
				t.Errorf("dynamic metadata = %v, want the domain, 2 descriptors and hitsAddend 1", resp.GetDynamicMetadata())
			}
			e := md["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()
			if len(e) != 1 || e[0].GetStringValue() != "regular=limit" {
				t.Errorf("descriptors[0].entries = %v, want [regular=limit]", e)
			}
			got := map[string]string{}
			for k, v := range md["metadata"].GetStructValue().GetFields() {
				got[k] = v.GetStringValue()
			}
			if len(got) != len(tc.want) {
				t.Errorf("metadata = %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("metadata[%q] = %q, want %q", k, got[k], v)
				}
			}
		})
	}
	if _, _, resp := quotaHarness(t, rules("name"), false).ask(t, &rlspb.RateLimitRequest{Domain: "quota-domain", Descriptors: ds(d("regular", "limit"))}); resp.DynamicMetadata != nil {
		t.Errorf("without envoy.response_metadata: dynamic metadata %v, want none", resp.DynamicMetadata)
	}
}

// TestQuotaServiceSelection ports envoyproxy/ratelimit's integration
// test of quota-based service selection (#1114,
// integration-test/scripts/multiservice-tokenquota.sh, with
// examples/ratelimit/config/example.yaml's quota rules): on the request
// path Envoy checks both services' quotas (hits_addend 0) and routes to
// the service named by the metadata; on the response path it spends 1
// on the service that answered (apply_on_stream_done, hits_addend 1).
// service_1 has 1 a minute, service_2 2 a minute.
//
// Theirs serves service_1 twice, service_2 three times and refuses the
// sixth request: a 0-hit check there is OVER_LIMIT only once the count
// is past the limit, so each service serves one more than its quota.
// sluice's check is OVER_LIMIT as soon as the next unit would be denied
// (docs/envoy.md), so it serves exactly the quotas: service_1 once,
// service_2 twice, and refuses the fourth; after a minute service_1
// serves again, as theirs.
func TestQuotaServiceSelection(t *testing.T) {
	t.Run("memstore", func(t *testing.T) { testQuotaServiceSelection(t, memQuota) })
	t.Run("redis", func(t *testing.T) { testQuotaServiceSelection(t, redisQuota(redistest.Standalone(t))) })
}

func testQuotaServiceSelection(t *testing.T, newStore quotaStore) {
	data, err := os.ReadFile("../rules/testdata/valid/quota.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h, clock := quotaHarnessOn(t, newStore, string(data), true)
	check := func() (string, string) {
		r := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: ds(d("service", "service_1"), d("service", "service_2"))}
		for _, desc := range r.Descriptors {
			desc.HitsAddend = wrapperspb.UInt64(0)
		}
		overall, _, resp := h.ask(t, r)
		md := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue()
		return overall, md.GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
	}
	debit := func(service string) {
		r := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: ds(d("service", service))}
		r.Descriptors[0].HitsAddend = wrapperspb.UInt64(1)
		if overall, _, _ := h.ask(t, r); overall != "OK" {
			t.Errorf("response path: debit %s = %s, want OK", service, overall)
		}
	}
	for i, want := range []string{"service_1", "service_2", "service_2"} {
		overall, service := check()
		if overall != "OK" || service != want {
			t.Fatalf("request %d: %s, served by %q; want OK, %q", i+1, overall, service, want)
		}
		debit(service)
	}
	if overall, service := check(); overall != "OVER_LIMIT" || service != "" {
		t.Errorf("request 4: %s, metadata names %q; want OVER_LIMIT and no service (every quota spent)", overall, service)
	}
	clock.Advance(time.Minute)
	if overall, service := check(); overall != "OK" || service != "service_1" {
		t.Errorf("a minute later: %s, %q; want OK, service_1", overall, service)
	}
}
