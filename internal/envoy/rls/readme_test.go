package rls_test

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// exampleStep is one request to an example's rules, sent times times
// (default once; the last answer is checked), after the clock moved by
// advance; reset, when set, is the first status's duration_until_reset.
type exampleStep struct {
	name    string
	advance time.Duration
	times   int
	descs   []*commonpb.RateLimitDescriptor
	overall string
	want    []st
	reset   time.Duration
}

// readmeExamples are envoyproxy/ratelimit's README Examples 1 to 11, each
// served from its rules file as copied (../rules/testdata/readme),
// and asked what the README says of it. The clock starts at a UTC
// midnight (sluicetest.NewClock), where every window starts.
var readmeExamples = []struct {
	file, domain string
	steps        []exampleStep
}{
	{"example01", "mongo_cps", []exampleStep{
		{name: "users: 500 a second", descs: ds(d("database", "users")), overall: "OK", want: []st{{"OK", "500/SECOND", 499}}, reset: time.Second},
		{name: "users: the 500th", times: 499, descs: ds(d("database", "users")), overall: "OK", want: []st{{"OK", "500/SECOND", 0}}},
		{name: "users: the 501st", descs: ds(d("database", "users")), overall: "OVER_LIMIT", want: []st{{"OVER_LIMIT", "500/SECOND", 0}}},
		{name: "default has its own", descs: ds(d("database", "default")), overall: "OK", want: []st{{"OK", "500/SECOND", 499}}},
		{name: "the next second", advance: time.Second, descs: ds(d("database", "users")), overall: "OK", want: []st{{"OK", "500/SECOND", 499}}},
		{name: "another database: no limit", descs: ds(d("database", "orders")), overall: "OK", want: []st{{"OK", "", 0}}},
	}},
	{"example02", "messaging", []exampleStep{
		{name: "the complete request", descs: ds(d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111")), overall: "OK", want: []st{{"OK", "5/DAY", 4}, {"OK", "100/DAY", 99}}, reset: 24 * time.Hour},
		{name: "the fifth marketing message", times: 4, descs: ds(d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111")), overall: "OK", want: []st{{"OK", "5/DAY", 0}, {"OK", "100/DAY", 95}}},
		{name: "the sixth: over, and nothing spent (one subject: all or nothing)", descs: ds(d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111")), overall: "OVER_LIMIT", want: []st{{"OVER_LIMIT", "5/DAY", 0}, {"OK", "100/DAY", 95}}},
		{name: "other messages to the number", descs: ds(d("to_number", "2061111111")), overall: "OK", want: []st{{"OK", "100/DAY", 94}}},
		{name: "another number has its own", descs: ds(d("message_type", "marketing", "to_number", "2062222222")), overall: "OK", want: []st{{"OK", "5/DAY", 4}}},
		{name: "at midnight UTC the day resets", advance: 24 * time.Hour, descs: ds(d("message_type", "marketing", "to_number", "2061111111")), overall: "OK", want: []st{{"OK", "5/DAY", 4}}},
	}},
	{"example03", "edge_proxy_per_ip", []exampleStep{
		{name: "an address: 10 a second", times: 10, descs: ds(d("remote_address", "50.0.0.1")), overall: "OK", want: []st{{"OK", "10/SECOND", 0}}},
		{name: "the 11th", descs: ds(d("remote_address", "50.0.0.1")), overall: "OVER_LIMIT", want: []st{{"OVER_LIMIT", "10/SECOND", 0}}},
		{name: "the black-listed address", descs: ds(d("remote_address", "50.0.0.5")), overall: "OVER_LIMIT", want: []st{{"OVER_LIMIT", "0/SECOND", 0}}},
		{name: "half a second on, the window closes at the second", advance: 500 * time.Millisecond, descs: ds(d("remote_address", "50.0.0.2")), overall: "OK", want: []st{{"OK", "10/SECOND", 9}}, reset: 500 * time.Millisecond},
	}},
	{"example04a", "example4", []exampleStep{
		{name: "two tuples do not match a one-level rule", descs: ds(d("key", "value", "subkey", "subvalue")), overall: "OK", want: []st{{"OK", "", 0}}},
		{name: "one tuple does", descs: ds(d("key", "value")), overall: "OK", want: []st{{"OK", "300/SECOND", 299}}},
	}},
	{"example04b", "example4", []exampleStep{
		{name: "two tuples match two levels", descs: ds(d("key", "value", "subkey", "subvalue")), overall: "OK", want: []st{{"OK", "300/SECOND", 299}}},
	}},
	{"example05", "internal", []exampleStep{
		{name: "unlimited", times: 3, descs: ds(d("ldap", "x")), overall: "OK", want: []st{{"OK", "", math.MaxUint32}}},
		{name: "limited", descs: ds(d("azure", "x")), overall: "OK", want: []st{{"OK", "100/MINUTE", 99}}},
	}},
	{"example06", "example6", []exampleStep{
		{name: "user-a: 10 a second", times: 10, descs: ds(d("service", "auth-service", "user", "user-a")), overall: "OK", want: []st{{"OK", "10/SECOND", 0}}},
		{name: "user-a over, shadow: OK", times: 5, descs: ds(d("service", "auth-service", "user", "user-a")), overall: "OK", want: []st{{"OK", "10/SECOND", 0}}},
		{name: "user-b: 20 a second", times: 20, descs: ds(d("service", "auth-service", "user", "user-b")), overall: "OK", want: []st{{"OK", "20/SECOND", 0}}},
		{name: "user-b over", descs: ds(d("service", "auth-service", "user", "user-b")), overall: "OVER_LIMIT", want: []st{{"OVER_LIMIT", "20/SECOND", 0}}},
	}},
	{"example07", "example7", []exampleStep{
		{name: "key_1 and key_2: 10 a second, the 5 replaced", times: 6, descs: ds(d("key_1", "value_1", "user", "bkthomps"), d("key_2", "value_2", "user", "bkthomps")), overall: "OK", want: []st{{"OK", "", 0}, {"OK", "10/SECOND", 4}}},
		{name: "the 5 a second limit was not affected", descs: ds(d("key_1", "value_1", "user", "bkthomps")), overall: "OK", want: []st{{"OK", "5/SECOND", 4}}},
		{name: "key_2 alone", descs: ds(d("key_2", "value_2", "user", "bkthomps")), overall: "OK", want: []st{{"OK", "10/SECOND", 3}}},
	}},
	{"example08", "example8", []exampleStep{
		{name: "an unspecified value: 10 a minute", advance: 20 * time.Second, descs: ds(d("key1", "unspecified_value")), overall: "OK", want: []st{{"OK", "10/MINUTE", 9}}, reset: 40 * time.Second},
		{name: "another has its own", descs: ds(d("key1", "unspecified_value2")), overall: "OK", want: []st{{"OK", "10/MINUTE", 9}}},
		{name: "value1: 20 a minute", descs: ds(d("key1", "value1")), overall: "OK", want: []st{{"OK", "20/MINUTE", 19}}},
	}},
	{"example09a", "example9", []exampleStep{
		{name: "value1", descs: ds(d("key1", "value1")), overall: "OK", want: []st{{"OK", "20/MINUTE", 19}}},
		{name: "valueXYZ has its own", descs: ds(d("key1", "valueXYZ")), overall: "OK", want: []st{{"OK", "20/MINUTE", 19}}},
		{name: "no match", descs: ds(d("key1", "other")), overall: "OK", want: []st{{"OK", "", 0}}},
	}},
	{"example09b", "example9", []exampleStep{
		{name: "/api/123/action", times: 20, descs: ds(d("path", "/api/123/action")), overall: "OK", want: []st{{"OK", "20/MINUTE", 0}}},
		{name: "/api/123/action over", descs: ds(d("path", "/api/123/action")), overall: "OVER_LIMIT", want: []st{{"OVER_LIMIT", "20/MINUTE", 0}}},
		{name: "/api/user-id/action has its own", descs: ds(d("path", "/api/user-id/action")), overall: "OK", want: []st{{"OK", "20/MINUTE", 19}}},
		{name: "/api/123/other does not match", descs: ds(d("path", "/api/123/other")), overall: "OK", want: []st{{"OK", "", 0}}},
	}},
	{"example09c", "example9", []exampleStep{
		{name: "v1", descs: ds(d("route", "/api/v1/resource/123/action")), overall: "OK", want: []st{{"OK", "20/MINUTE", 19}}},
		{name: "v2", descs: ds(d("route", "/api/v2/resource/456/action")), overall: "OK", want: []st{{"OK", "20/MINUTE", 19}}},
		{name: "no match", descs: ds(d("route", "/api/v2/resource/456")), overall: "OK", want: []st{{"OK", "", 0}}},
	}},
	{"example10a", "example10", []exampleStep{
		{name: "api GET 123", descs: ds(d("route", "api", "http_method", "GET", "subject_id", "123")), overall: "OK", want: []st{{"OK", "60/MINUTE", 59}}},
		{name: "web POST 456 has its own", descs: ds(d("route", "web", "http_method", "POST", "subject_id", "456")), overall: "OK", want: []st{{"OK", "60/MINUTE", 59}}},
		{name: "api GET 123 again", descs: ds(d("route", "api", "http_method", "GET", "subject_id", "123")), overall: "OK", want: []st{{"OK", "60/MINUTE", 58}}},
	}},
	{"example10b", "example10_wildcard", []exampleStep{
		{name: "alice readfile documents", descs: ds(d("user", "alice", "action", "readfile", "resource", "documents")), overall: "OK", want: []st{{"OK", "100/MINUTE", 99}}},
		{name: "readdir is another value", descs: ds(d("user", "alice", "action", "readdir", "resource", "documents")), overall: "OK", want: []st{{"OK", "100/MINUTE", 99}}},
		{name: "writefile does not match", descs: ds(d("user", "alice", "action", "writefile", "resource", "documents")), overall: "OK", want: []st{{"OK", "", 0}}},
	}},
	{"example11a", "example11", []exampleStep{
		{name: "5 for files/a.pdf", times: 5, descs: ds(d("files", "files/a.pdf")), overall: "OK", want: []st{{"OK", "10/HOUR", 5}}},
		{name: "5 for files/b.csv: one threshold", times: 5, descs: ds(d("files", "files/b.csv")), overall: "OK", want: []st{{"OK", "10/HOUR", 0}}},
		{name: "files/c.txt is over", descs: ds(d("files", "files/c.txt")), overall: "OVER_LIMIT", want: []st{{"OVER_LIMIT", "10/HOUR", 0}}},
		{name: "10 for files_no_share/a.pdf", times: 10, descs: ds(d("files_no_share", "files_no_share/a.pdf")), overall: "OK", want: []st{{"OK", "10/HOUR", 0}}},
		{name: "files_no_share/b.csv has its own", descs: ds(d("files_no_share", "files_no_share/b.csv")), overall: "OK", want: []st{{"OK", "10/HOUR", 9}}},
	}},
	{"example11b", "example11_metrics", []exampleStep{
		{name: "api/v1 GET", descs: ds(d("route", "api/v1", "method", "GET")), overall: "OK", want: []st{{"OK", "60/MINUTE", 59}}},
		{name: "api/v2 GET shares the threshold", descs: ds(d("route", "api/v2", "method", "GET")), overall: "OK", want: []st{{"OK", "60/MINUTE", 58}}},
		{name: "POST is another method", descs: ds(d("route", "api/v2", "method", "POST")), overall: "OK", want: []st{{"OK", "60/MINUTE", 59}}},
	}},
}

func ds(descs ...*commonpb.RateLimitDescriptor) []*commonpb.RateLimitDescriptor { return descs }

// runExamples serves each README example with a store newStore builds on
// a clock of its own and checks every step over gRPC.
func runExamples(t *testing.T, newStore func(t *testing.T, clock *sluicetest.Clock) sluice.Store) {
	for _, ex := range readmeExamples {
		t.Run(ex.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("..", "rules", "testdata", "readme", ex.file+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			clock := sluicetest.NewClock()
			h := start(t, newStore(t, clock), string(data))
			for _, s := range ex.steps {
				clock.Advance(s.advance)
				r := &rlspb.RateLimitRequest{Domain: ex.domain, Descriptors: s.descs}
				for range s.times - 1 {
					h.ask(t, r)
				}
				overall, got, resp := h.ask(t, r)
				if overall != s.overall || !cmp.Equal(got, s.want) {
					t.Fatalf("%s: ShouldRateLimit = %s %+v, want %s %+v", s.name, overall, got, s.overall, s.want)
				}
				if s.reset != 0 {
					if r := resp.Statuses[0].GetDurationUntilReset().AsDuration(); r != s.reset {
						t.Errorf("%s: duration_until_reset = %v, want %v (to the clock's boundary)", s.name, r, s.reset)
					}
				}
			}
		})
	}
}

func TestReadmeExamplesMemstore(t *testing.T) {
	runExamples(t, func(t *testing.T, clock *sluicetest.Clock) sluice.Store {
		ms, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		return ms
	})
}

func TestReadmeExamplesRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	runExamples(t, func(t *testing.T, clock *sluicetest.Clock) sluice.Store {
		return redisStore(t, srv, clock)
	})
}
