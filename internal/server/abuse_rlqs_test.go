package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// The callers of Envoy's quota service (docs/security.md): the admin
// API's plan for a bucket ("override rlqs"), the list of buckets ("rlqs
// list") and the stream itself ("rlqs stream"). Whatever they send, a
// plan changes only the numbers of a bucket an existing matcher takes,
// the list and the service's state stay bounded, and no bucket value
// reaches an answer or a log line.

// rawValue is the hostile callers' tenant value, which must never come
// back.
const rawValue = "zq-7731-secret"

// TestAbuseOverrideRLQS plays the callers of an RLQS plan: no token, a
// token without the admin scope, an admin naming "*", huge or empty
// ids, a domain or key set no matcher has, another policy, numbers
// Envoy's bucket cannot enforce, two subjects at once. Each is refused
// (401, 403, 400, 404, 422); no plan is added; the proxy keeps the
// policy's share; the value is in no answer and no log line. On memory
// and Redis.
func TestAbuseOverrideRLQS(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testAbuseOverrideRLQS(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testAbuseOverrideRLQS(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
	t.Run("no tokens", func(t *testing.T) {
		// An open server would let anyone raise their own bucket.
		cfg := strings.Replace(rlqsAdminConfig(""), "  auth:\n    tokens:\n      - { id: ops, secret_env: OVR_ADMIN, scopes: [admin] }\n      - { id: app, secret_env: OVR_CHECK, scopes: [check] }\n", "", 1)
		s, _ := startRLQSAdmin(t, cfg)
		if code, body := call(t, "PUT", s.url+"/v1/overrides", "", plan(`{"tenant":"`+rawValue+`"}`, 1000, 2000)); code != http.StatusForbidden || strings.Contains(body, rawValue) {
			t.Errorf("PUT an rlqs plan without tokens configured = %d %s, want 403", code, body)
		}
	})
	t.Run("no envoy.rlqs", func(t *testing.T) {
		url := startOverrideServer(t, overridesConfig(""))
		if code, body := call(t, "PUT", url+"/v1/overrides", ovrAdminToken, plan(`{"tenant":"`+rawValue+`"}`, 1000, 2000)); code != http.StatusNotFound || strings.Contains(body, rawValue) {
			t.Errorf("PUT an rlqs plan to a server without envoy.rlqs = %d %s, want 404", code, body)
		}
		if code, body := call(t, "GET", url+checkapi.RLQSPath, ovrAdminToken, ""); code != http.StatusNotFound {
			t.Errorf("GET /v1/rlqs of a server without envoy.rlqs = %d %s, want 404", code, body)
		}
	})
}

// plan is a PUT body naming bucket (JSON) of domain edge.
func plan(bucket string, limit, burst int) string {
	return fmt.Sprintf(`{"rlqs":{"domain":"edge","bucket":%s},"limit":%d,"burst":%d}`, bucket, limit, burst)
}

func testAbuseOverrideRLQS(t *testing.T, store string) {
	s, p := startRLQSAdmin(t, rlqsAdminConfig(store))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := map[string]string{"tenant": rawValue}
	p.Admit(id)
	awaitTokenBucket(ctx, t, p, id, 187, 375, 4)
	_, before := call(t, "GET", s.url+"/v1/overrides", ovrAdminToken, "")
	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf(`"k%d":%q`, i, rawValue)
	}
	huge := strings.Repeat("x", 300)
	for _, c := range []struct {
		name, token, body string
		code              int
		want              string
	}{
		{"no token", "", plan(`{"tenant":"`+rawValue+`"}`, 1000, 2000), 401, ""},
		{"a check token", ovrCheckToken, plan(`{"tenant":"`+rawValue+`"}`, 1000, 2000), 403, ""},
		{"every tenant", ovrAdminToken, plan(`{"tenant":"*"}`, 1000000, 2000000), 400, "each must be the value the bucket id has"},
		{"an empty value", ovrAdminToken, plan(`{"tenant":""}`, 1000, 2000), 400, "never empty"},
		{"no entry", ovrAdminToken, plan(`{}`, 1000, 2000), 400, "1 to 32"},
		{"33 entries", ovrAdminToken, plan("{"+strings.Join(many, ",")+"}", 1000, 2000), 400, "1 to 32"},
		{"a huge value", ovrAdminToken, plan(`{"tenant":"`+rawValue+huge+`"}`, 1000, 2000), 400, "at most 256"},
		{"a huge key", ovrAdminToken, plan(`{"`+huge+`":"`+rawValue+`"}`, 1000, 2000), 400, "at most 256"},
		{"a huge domain", ovrAdminToken, fmt.Sprintf(`{"rlqs":{"domain":%q,"bucket":{"tenant":%q}},"limit":1000}`, strings.Repeat("d", 2000), rawValue), 400, "1 to 1024"},
		{"another domain", ovrAdminToken, fmt.Sprintf(`{"rlqs":{"domain":"other","bucket":{"tenant":%q}},"limit":1000}`, rawValue), 404, "no matcher"},
		{"another key set", ovrAdminToken, plan(`{"user":"`+rawValue+`"}`, 1000, 2000), 404, "no matcher"},
		{"another policy", ovrAdminToken, fmt.Sprintf(`{"policy":"api","rlqs":{"domain":"edge","bucket":{"tenant":%q}},"limit":1000}`, rawValue), 400, "per-tenant"},
		{"a burst below the rate", ovrAdminToken, plan(`{"tenant":"`+rawValue+`"}`, 1000, 10), 422, "set burst to at least 1000"},
		{"two subjects", ovrAdminToken, fmt.Sprintf(`{"subject":"x","rlqs":{"domain":"edge","bucket":{"tenant":%q}},"limit":1000}`, rawValue), 400, "set one of subject, envoy, proxy and rlqs"},
	} {
		code, body := call(t, "PUT", s.url+"/v1/overrides", c.token, c.body)
		if code != c.code || !strings.Contains(body, c.want) || strings.Contains(body, rawValue) {
			t.Errorf("%s: PUT = %d %s, want %d naming %q, without the bucket value", c.name, code, body, c.code, c.want)
		}
	}
	if _, after := call(t, "GET", s.url+"/v1/overrides", ovrAdminToken, ""); after != before {
		t.Errorf("the plans changed under refused PUTs:\nbefore %s\nafter  %s", before, after)
	}
	if st := p.State(id); !hasTokenBucket(st, 187, 375, 4) {
		t.Errorf("the bucket after refused PUTs = %+v, want the policy's share, 187 tokens, 93.75 a second (375 every 4 s)", st)
	}
	if l := logLinesWith(s.logs.String(), rawValue); l != "" {
		t.Errorf("the server's log carries the bucket value:\n%s", l)
	}
}

// rlqsCapped is rlqsAdminConfig with at most 5 buckets per domain.
func rlqsCapped() string {
	return strings.Replace(rlqsAdminConfig(""), "    round: 100ms\n", "    round: 100ms\n    max_buckets_per_domain: 5\n", 1)
}

// TestAbuseRLQSList plays the readers of GET /v1/rlqs: no token (401), a
// token without the admin scope (403), a limit past 1000 (400); an
// admin's list holds at most the domain's cap of buckets however many a
// stream names, and never a bucket id.
func TestAbuseRLQSList(t *testing.T) {
	s, p := startRLQSAdmin(t, rlqsCapped())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		p.Admit(map[string]string{"tenant": fmt.Sprintf("%s-%d", rawValue, i)})
	}
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token, query string
		code         int
	}{{"", "", 401}, {ovrCheckToken, "", 403}, {ovrAdminToken, "?limit=1000000", 400}} {
		if code, body := call(t, "GET", s.url+checkapi.RLQSPath+c.query, c.token, ""); code != c.code {
			t.Errorf("GET /v1/rlqs%s with token %q = %d %s, want %d", c.query, c.token, code, body, c.code)
		}
	}
	code, list, raw := rlqsBuckets(t, s.url, "?limit=1000")
	if code != 200 || len(list.Buckets) != 5 || list.Truncated || strings.Contains(raw, rawValue) {
		t.Errorf("GET /v1/rlqs?limit=1000 after 20 buckets on a cap of 5 = %d %s, want the 5 buckets kept, no bucket id", code, raw)
	}
}

// TestAbuseRLQSStream plays an Envoy stream (the service takes no token:
// whoever reaches envoy.listen): 20 tenants on a cap of 5 buckets, a
// tenant named "*", a key set no matcher takes. The service keeps state
// for at most the cap; every bucket past it, and "*", hears a token
// bucket of at most the policy (the overflow answer splits it over the
// streams); the unmatched bucket is allowed, as RLS answers OK without a
// rule; no value reaches the log.
func TestAbuseRLQSStream(t *testing.T) {
	s, p := startRLQSAdmin(t, rlqsCapped())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []map[string]string
	for i := range 20 {
		ids = append(ids, map[string]string{"tenant": fmt.Sprintf("%s-%d", rawValue, i)})
	}
	ids = append(ids, map[string]string{"tenant": "*"})
	unmatched := map[string]string{"user": rawValue}
	for _, id := range append(ids, unmatched) {
		p.Admit(id)
	}
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		st := p.State(id)
		tb := st.Strategy.GetTokenBucket()
		deny := st.Strategy.GetBlanketRule() == typepb.RateLimitStrategy_DENY_ALL
		if st.Phase != envoyrlqs.Assignment || !deny && (tb == nil || tb.GetMaxTokens() > 200 || tb.GetTokensPerFill().GetValue() > 100*uint32(tb.GetFillInterval().GetSeconds())) {
			t.Errorf("bucket %v = %+v, want a token bucket of at most the policy's 200 tokens, 100 a second (or DENY_ALL)", id, st)
		}
	}
	if st := p.State(unmatched); st.Phase != envoyrlqs.Assignment || st.Strategy.GetBlanketRule() != typepb.RateLimitStrategy_ALLOW_ALL {
		t.Errorf("the unmatched bucket = %+v, want ALLOW_ALL", st)
	}
	if _, list, raw := rlqsBuckets(t, s.url, "?limit=1000"); len(list.Buckets) > 5 {
		t.Errorf("GET /v1/rlqs after 21 buckets on a cap of 5 = %s, want at most 5 kept", raw)
	}
	if l := logLinesWith(s.logs.String(), rawValue); l != "" {
		t.Errorf("the server's log carries a bucket value:\n%s", l)
	}
}
