package rules

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
)

func TestInvalid(t *testing.T) {
	for _, tc := range []struct {
		file string
		want string // the message after "testdata/invalid/<file>: "
	}{
		{"bad_algorithm.yaml", `descriptors[0].rate_limit.algorithm: "leaky_bucket": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra (line 7)`},
		{"concurrency.yaml", `descriptors[0].rate_limit.algorithm: "concurrency": is not an algorithm of the Envoy service: an in-flight limit is sluice_in_flight: {limit: N, lease_ttl: D} on a descriptor whose value names the request (docs/envoy.md, In-flight limits) (line 7)`},
		{"bad_failure_mode.yaml", `descriptors[0].rate_limit.failure_mode: "local": must be one of closed, open`},
		{"bad_unit.yaml", `descriptors[0].rate_limit.unit: "fortnight": must be one of second, minute, hour, day, week, month, year (line 5)`},
		{"burst_fixed_window.yaml", `descriptors[0].rate_limit.burst: 10: applies only to token_bucket and gcra; leave it unset for fixed_window (line 7)`},
		{"duplicate_descriptor.yaml", `descriptors[1].value: "v": duplicate descriptor: d.k_v is already defined at this level (line 7)`},
		{"empty_key.yaml", `descriptors[0].key: "": must not be empty (line 3)`},
		{"invalid_yaml.yaml", `invalid YAML: did not find expected '-' indicator`},
		{"limit_too_big.yaml", `descriptors[0].rate_limit.requests_per_unit: 2000000000: must be between 1 and 1000000000 (line 4)`},
		{"list_of_scalars.yaml", `descriptors[0]: "k": must be a mapping, not a scalar (line 3)`},
		{"missing_key.yaml", `descriptors[0].key: is required (line 3)`},
		{"no_domain.yaml", `domain: is required`},
		{"replaces_empty.yaml", `descriptors[0].rate_limit.replaces[0].name: is required: the name of the rate_limit this one replaces (line 6)`},
		{"replaces_self.yaml", `descriptors[0].rate_limit.replaces[0].name: "mine": is this rate_limit's own name: a rule cannot replace itself (line 7)`},
		{"rpu_string.yaml", `descriptors[0].rate_limit.requests_per_unit: "many": must be an integer (line 6)`},
		{"shadow_not_bool.yaml", `descriptors[0].shadow_mode: "yes please": must be true or false (line 4)`},
		{"unknown_key.yaml", `descriptors[0].rate_limits: unknown key: must be one of key, value, rate_limit, shadow_mode, detailed_metric, value_to_metric, share_threshold, metadata, quota_mode, descriptors (line 4)`},
		{"quota_mode_not_bool.yaml", `descriptors[0].quota_mode: "sometimes": must be true or false (line 4)`},
		{"share_threshold_no_wildcard.yaml", `descriptors[0].share_threshold: true: applies only to a descriptor whose value holds a wildcard (*): it makes every value the wildcard matches share one counter (line 5)`},
		{"value_to_metric_not_bool.yaml", `descriptors[0].value_to_metric: "yes": must be true or false (line 4)`},
		{"align_token_bucket.yaml", `descriptors[0].rate_limit.align: "clock": applies only to fixed_window, the one algorithm with windows to align (line 8)`},
		{"align_unknown.yaml", `descriptors[0].rate_limit.align: "midnight": must be one of clock (the default: windows start on the UTC second, minute, hour or day), first_request (a window opens at its first admitted request) (line 7)`},
		{"wildcard_duplicate.yaml", `descriptors[1].value: "/api/*/action": duplicate descriptor: d.path_/api/*/action is already defined at this level (line 7)`},
		{"unlimited_with_unit.yaml", `descriptors[0].rate_limit.unit: "second": must not be set when unlimited is true (line 6)`},
		{"in_flight_with_value.yaml", `descriptors[0].descriptors[0].value: "fixed": must not be set on a descriptor with sluice_in_flight: the value Envoy sends for its key names the lease (e.g. the x-request-id header), so each request holds its own (line 6)`},
		{"in_flight_with_unit.yaml", `descriptors[0].rate_limit.unit: "second": must not be set with sluice_in_flight, which counts requests in flight, not a rate (line 5)`},
		{"in_flight_no_ttl.yaml", `descriptors[0].rate_limit.sluice_in_flight.lease_ttl: is required: how long a lease lives when the stream-done call never comes (a crashed Envoy), e.g. 5m (line 5)`},
		{"settle_sliding_window.yaml", `descriptors[0].rate_limit.sluice_settle: true: applies only to fixed_window, sliding_log, token_bucket and gcra: a sliding_window cannot give back exactly what a settle returns (line 8)`},
		{"settle_not_bool.yaml", `descriptors[0].rate_limit.sluice_settle: "yes": must be true or false (line 4)`},
		{"settle_unlimited.yaml", `descriptors[0].rate_limit.sluice_settle: true: must not be set when unlimited is true (line 6)`},
		{"settle_bucket_debt.yaml", `descriptors[0].rate_limit.sluice_settle: true: cannot settle this rule: policy "d.tenant": invalid request: an estimate on token_bucket: a settle carries up to a full bucket of debt, so 2 × burst × window in µs must stay below 2^53; at this window the burst can be at most 1737 (line 8)`},
		{"priorities_unlimited.yaml", `descriptors[0].rate_limit.sluice_priorities: {critical: 100%, sheddable: 50%}: must not be set when unlimited is true: a rule without a remaining budget has nothing to share among classes (line 6)`},
		{"priorities_zero.yaml", `descriptors[0].rate_limit.sluice_priorities: {sheddable: 50%}: must not be set with requests_per_unit 0, which denies every request: a rule without a remaining budget has nothing to share among classes (line 7)`},
		{"priorities_share_too_big.yaml", `descriptors[0].rate_limit.sluice_priorities.sheddable: "150%": must be between 1% and 100% of the policy's capacity (line 9)`},
		{"priorities_not_percent.yaml", `descriptors[0].rate_limit.sluice_priorities.sheddable: "half": must be the share of the policy's capacity this class may use, in whole percent, e.g. 50% (line 8)`},
		{"priorities_bad_class.yaml", `descriptors[0].rate_limit.sluice_priorities: "Bulk": a class name is 1 to 32 characters of a-z 0-9 _ - (line 9)`},
		{"priorities_no_unit_left.yaml", `descriptors[0].rate_limit.sluice_priorities.sheddable: "20%": leaves this class no unit of the policy's capacity of 3: raise the share to at least 34% (line 7)`},
		{"priorities_not_mapping.yaml", `descriptors[0].rate_limit.sluice_priorities: "sheddable": must be a mapping, not a scalar (line 7)`},
		{"priorities_in_flight_no_unit_left.yaml", `descriptors[0].descriptors[0].rate_limit.sluice_priorities.sheddable: "10%": leaves this class no unit of the policy's capacity of 4: raise the share to at least 25% (line 8)`},
		{"local_quota_sliding_log.yaml", `descriptors[0].rate_limit.sluice_local_quota: true: does not apply to sliding_log: a block's entries would have to be dated after the log's newest write; use gcra or token_bucket for a hot subject (line 8)`},
		{"local_quota_in_flight.yaml", `descriptors[0].rate_limit.sluice_local_quota: true: must not be set with sluice_in_flight, which counts requests in flight, not a rate (line 6)`},
		{"local_quota_unlimited.yaml", `descriptors[0].rate_limit.sluice_local_quota: true: must not be set when unlimited is true (line 6)`},
		{"local_quota_denies_all.yaml", `descriptors[0].rate_limit.sluice_local_quota: true: must not be set with requests_per_unit 0, which denies every request (line 7)`},
		{"local_quota_settle.yaml", `descriptors[0].rate_limit.sluice_local_quota: true: must not be set with sluice_settle: every request of a settling rule carries its request id, and the store decides each such request itself (line 8)`},
		{"local_quota_small_limit.yaml", `descriptors[0].rate_limit.sluice_local_quota: true: needs a max_cost of at least 8, not 5: a limit this small is best decided by the store, one request at a time (line 7)`},
		{"local_quota_block_time.yaml", `descriptors[0].rate_limit.sluice_local_quota.block_time: "2s": must be between 1ms and 1s, at most half the window (500ms), a whole number of microseconds (line 8)`},
		{"local_quota_zero.yaml", `descriptors[0].rate_limit.sluice_local_quota.max_block: 0: must not be zero; leave it out for the default (line 7)`},
		{"local_quota_unknown_key.yaml", `descriptors[0].rate_limit.sluice_local_quota.block: unknown key: must be one of block_time, max_block (line 7)`},
		{"local_quota_not_bool.yaml", `descriptors[0].rate_limit.sluice_local_quota: "yes": must be true or false, or a mapping of block_time and max_block (line 4)`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			name := filepath.Join("testdata", "invalid", tc.file)
			_, err := Load([]string{name})
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Load(%q) = %v, want an *Error", name, err)
			}
			if got := err.Error(); !strings.HasPrefix(got, name+": "+tc.want) {
				t.Errorf("Load(%q) = %q, want %q", name, got, name+": "+tc.want)
			}
			if e.Line == 0 {
				t.Errorf("Load(%q): error has no line", name)
			}
		})
	}
	// Every fixture has a case.
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) != 49 {
		t.Errorf("testdata/invalid holds %d files, the table %d: add the new case", len(files), 49)
	}
}

// TestWarnings: what envoyproxy/ratelimit loads, sluice loads. A rule
// that can never match and a replaces naming no rate_limit load, each a
// warning with its file, path, value, rule and line (sluice validate
// prints them, --strict refuses them; serve logs and counts them).
func TestWarnings(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"replaces_unknown.yaml", `descriptors[0].rate_limit.replaces[0].name: "nowhere": names no rate_limit of this domain: it replaces nothing (a typo here leaves both limits applied) (line 6)`},
		{"wildcard_never_matches.yaml", `descriptors[1].value: "/api/*/action": can never match: the wildcard "/api/*" above it (line 4) matches every value this one does, and the first wildcard that matches wins (line 7)`},
		{"settle_request_id_key.yaml", `descriptors[0].descriptors[0].key: "sluice_request_id": is a key sluice reads itself and removes before matching (the request id and the stream-done marker of sluice_settle): a descriptor with it would never match; see docs/envoy.md, Costs settled on stream done (line 5)`},
		{"priority_key.yaml", `descriptors[0].descriptors[0].key: "sluice_priority": is a key sluice reads itself and removes before matching (the request's priority class, see sluice_priorities): a descriptor with it would never match; see docs/envoy.md, Priorities (line 5)`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			name := filepath.Join("testdata", "warnings", tc.file)
			c, err := Load([]string{name})
			if err != nil {
				t.Fatalf("Load(%q) = %v, want it loaded with a warning", name, err)
			}
			ws := c.Warnings()
			if len(ws) != 1 || ws[0].Error() != name+": "+tc.want {
				t.Errorf("Load(%q).Warnings() = %q, want [%q]", name, ws, name+": "+tc.want)
			}
		})
	}
	files, _ := filepath.Glob("testdata/warnings/*.yaml")
	if len(files) != 4 {
		t.Errorf("testdata/warnings holds %d files, the table 4: add the new case", len(files))
	}
	// The shadowed wildcard loads and never matches: the first listed wins,
	// as in envoyproxy/ratelimit.
	c, err := Parse([]Source{{Name: "w.yaml", Data: []byte("domain: d\ndescriptors:\n  - { key: k, value: \"ab*\", rate_limit: { unit: hour, requests_per_unit: 1 } }\n  - { key: k, value: \"abc*\", rate_limit: { unit: hour, requests_per_unit: 2 } }\n")}})
	if err != nil {
		t.Fatalf("Parse(ab* then abc*) = %v, want loaded", err)
	}
	if r, _ := c.Match("d", []Entry{{Key: "k", Value: "abcd"}}); r == nil || r.Policy.Limit != 1 {
		t.Errorf("Match(k=abcd) = %+v, want the first wildcard's rule (limit 1)", r)
	}
}

// TestEveryProblem: Parse reports every problem of every file in one
// pass, sorted by file (in the order given) and line, and a file with a
// problem still has the rest of it checked.
func TestEveryProblem(t *testing.T) {
	_, err := Parse([]Source{
		{Name: "b.yaml", Data: []byte("domain: two\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, burst: 0 }\n")},
		{Name: "a.yaml", Data: []byte(`descriptors:
  - rate_limit: { unit: hour, requests_per_unit: 1 }
    descriptors:
      - key: inner
        rate_limit: { unit: hour, requests_per_unit: lots }
  - key: k
    value: "*"
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: k
    value: "a*"
    rate_limit: { unlimited: true, unit: hour }
`)},
		{Name: "c.yaml", Data: []byte("domain: [x\n")},
	})
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("Parse = %v, want Errors", err)
	}
	want := []string{
		"b.yaml: descriptors[0].rate_limit.burst: 0: must not be zero; leave it out for the default (requests_per_unit) (line 4)",
		"a.yaml: domain: is required: the domain Envoy's rate_limit filter names (line 1)",
		"a.yaml: descriptors[0].key: is required (line 2)",
		`a.yaml: descriptors[0].descriptors[0].rate_limit.requests_per_unit: "lots": must be an integer (line 5)`,
		`a.yaml: descriptors[2].rate_limit.unit: "hour": must not be set when unlimited is true (line 11)`,
		"c.yaml: invalid YAML: did not find expected ',' or ']' (line 1)",
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Error())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Parse errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestInFlight: a sluice_in_flight rule is a concurrency policy whose
// lease the descriptor's value names; the subject is the entries above.
func TestInFlight(t *testing.T) {
	c, err := Parse([]Source{{Name: "f.yaml", Data: []byte(`domain: api
descriptors:
  - key: user
    descriptors:
      - key: request_id
        rate_limit:
          failure_mode: open
          sluice_in_flight: { limit: 10, lease_ttl: 5m }
`)}})
	if err != nil {
		t.Fatal(err)
	}
	r, vars := c.Match("api", []Entry{{"user", "alice"}, {"request_id", "r1"}})
	want := sluice.Policy{ID: "api.user.request_id", Algorithm: sluice.Concurrency, Limit: 10, LeaseTTL: 5 * time.Minute}
	if r == nil || !r.InFlight || !reflect.DeepEqual(r.Policy, want) || r.RequestsPerUnit != 10 || r.FailureMode != failure.Open {
		t.Fatalf("Match = %+v, want an in-flight rule with policy %+v, failing open", r, want)
	}
	if fmtEntries(vars) != "[{user alice} {request_id r1}]" {
		t.Errorf("vars = %s, want the user and the request id", fmtEntries(vars))
	}
}

// TestQuotaModeAndMetadata loads envoyproxy/ratelimit's metadata.yaml
// (test/config, copied unchanged) and the quota example of their
// examples/ratelimit/config/example.yaml: a rule carries its
// descriptor's quota_mode and metadata, as their GetLimit returns them
// (their TestMetadata).
func TestQuotaModeAndMetadata(t *testing.T) {
	c, err := Load([]string{"testdata/valid/metadata.yaml", "testdata/valid/quota.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Match("test-domain", []Entry{{"key1", "value1"}, {"subkey1", "something"}})
	if r == nil || r.RequestsPerUnit != 5 || r.Unit != Second || r.Metadata.GetFields()["name"].GetStringValue() != "service_1" {
		t.Errorf("key1_value1.subkey1 = %+v, want 5 a second with metadata name: service_1", r)
	}
	r, _ = c.Match("test-domain", []Entry{{"key2", "something"}})
	if r == nil || r.RequestsPerUnit != 20 || r.Metadata.GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue() != "service_2" {
		t.Errorf("key2 = %+v, want 20 a minute with metadata service_with_quota.name: service_2", r)
	}
	r, _ = c.Match("test-domain", []Entry{{"key1", "value1"}, {"subkey1", "subvalue1"}})
	if r == nil || r.Metadata != nil {
		t.Errorf("key1_value1.subkey1_subvalue1 = %+v, want no metadata", r)
	}
	r, _ = c.Match("rl", []Entry{{"service", "service_2"}})
	if r == nil || !r.QuotaMode || r.RequestsPerUnit != 2 || r.Metadata.GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue() != "service_2" {
		t.Errorf("service_2 = %+v, want quota_mode, 2 a minute, metadata service_with_quota.name: service_2", r)
	}
}

func TestWildcardCovers(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"*", "a*", true},
		{"a*", "*", false},
		{"/api/*", "/api/*/action", true},
		{"/api/*/action", "/api/*", false},
		{"/api/*/action", "/api/v1/*/action", true},
		{"*ab*", "*a*b*", false}, // "acb" matches the second only
		{"a*b", "a*b*b", true},
		{"a*", "b*", false},
		{"*x*", "*x*y*", true},
	} {
		if got := wildcardCovers(tc.a, tc.b); got != tc.want {
			t.Errorf("wildcardCovers(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestEmptyValues: envoyproxy/ratelimit reads an empty value as an absent
// one, so files that leave keys empty load the same here.
func TestEmptyValues(t *testing.T) {
	c, err := Parse([]Source{{Name: "e.yaml", Data: []byte(`domain: d
descriptors:
  - key: k
    value:
    shadow_mode:
    rate_limit:
      name:
      replaces:
      unit: second
      requests_per_unit: 2
  - key: placeholder
    rate_limit:
    descriptors:
`)}})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := c.Match("d", []Entry{{"k", "v"}}); r == nil || r.Shadow || r.RequestsPerUnit != 2 {
		t.Errorf("Match(k) = %+v, want the 2 per second rule", r)
	}
	if r, _ := c.Match("d", []Entry{{"placeholder", "v"}}); r != nil {
		t.Errorf("Match(placeholder) = %+v, want no rule", r)
	}
	if _, err := Parse([]Source{{Name: "e.yaml", Data: []byte("domain: d\ndescriptors:\n  - key:\n")}}); err == nil || !strings.Contains(err.Error(), "descriptors[0].key: is required (line 3)") {
		t.Errorf("an empty key: %v, want it required", err)
	}
}

func TestLoadDomainsAndGlobs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: one\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
	write("b.yaml", "domain: two\n")
	c, err := Load([]string{filepath.Join(dir, "*.yaml"), filepath.Join(dir, "a.yaml"), filepath.Join(dir, "none-*.yml")})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "one,two" {
		t.Errorf("Domains() = %q, want one,two", got)
	}
	if len(c.Files()) != 2 || len(c.Hash()) != 64 {
		t.Errorf("Files() = %q, Hash() = %q; want 2 files and a SHA-256", c.Files(), c.Hash())
	}
	write("c.yaml", "domain: one\n")
	_, err = Load([]string{filepath.Join(dir, "*.yaml")})
	if want := `c.yaml: domain: "one": is already the domain of ` + filepath.Join(dir, "a.yaml"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("two files with domain one: %v, want %q", err, want)
	}
	if _, err := Load([]string{filepath.Join(dir, "*.json")}); err == nil || !strings.Contains(err.Error(), "no rules file matches") {
		t.Errorf("a pattern that matches nothing: %v, want no rules file matches", err)
	}
}

func TestMatch(t *testing.T) {
	c, err := Load([]string{"testdata/valid/messaging.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	e := func(kv ...string) []Entry {
		var es []Entry
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, Entry{kv[i], kv[i+1]})
		}
		return es
	}
	for _, tc := range []struct {
		name    string
		domain  string
		entries []Entry
		rule    string // Rule.Key; "" for none
		vars    string
	}{
		{"nested", "messaging", e("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number", "[{to_number 2061111111}]"},
		{"key only", "messaging", e("to_number", "2061111111"), "messaging.to_number", "[{to_number 2061111111}]"},
		{"placeholder has no limit", "messaging", e("message_type", "marketing"), "", "[]"},
		{"most specific wins", "messaging", e("remote_address", "50.0.0.5"), "messaging.remote_address_50.0.0.5", "[]"},
		{"default value", "messaging", e("remote_address", "50.0.0.6"), "messaging.remote_address", "[{remote_address 50.0.0.6}]"},
		{"wildcard", "messaging", e("path", "/api/v1/users"), "messaging.path_/api/*", "[{path /api/v1/users}]"},
		{"wildcard miss", "messaging", e("path", "/web"), "", "[]"},
		{"deeper than the tree", "messaging", e("to_number", "1", "extra", "x"), "", "[]"},
		{"shallower than the tree", "messaging", e("service", "s"), "", "[]"},
		{"unknown key", "messaging", e("nope", "x"), "", "[]"},
		{"unknown domain", "other", e("to_number", "1"), "", "[]"},
		{"no entries", "messaging", nil, "", "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, vars := c.Match(tc.domain, tc.entries)
			got := ""
			if r != nil {
				got = r.Key
			}
			if got != tc.rule {
				t.Fatalf("Match(%q, %v) = rule %q, want %q", tc.domain, tc.entries, got, tc.rule)
			}
			if r != nil && fmtEntries(vars) != tc.vars {
				t.Errorf("Match(%q, %v) vars = %s, want %s", tc.domain, tc.entries, fmtEntries(vars), tc.vars)
			}
			// AppendMatch over a buffer a previous descriptor filled
			// answers alike, none of the old entries left.
			dirty := []Entry{{"stale", "1"}, {"stale", "2"}}
			ar, avars := c.AppendMatch(dirty, tc.domain, tc.entries)
			if ar != r || fmtEntries(avars) != fmtEntries(vars) {
				t.Errorf("AppendMatch(dirty, %q, %v) = %v %s, want Match's %v %s", tc.domain, tc.entries, ar, fmtEntries(avars), r, fmtEntries(vars))
			}
		})
	}
}

func fmtEntries(es []Entry) string {
	var b strings.Builder
	b.WriteString("[")
	for i, e := range es {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString("{" + e.Key + " " + e.Value + "}")
	}
	return b.String() + "]"
}

func TestRules(t *testing.T) {
	c, err := Load([]string{"testdata/valid/messaging.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*Rule{}
	for _, r := range c.Rules() {
		byKey[r.Key] = r
	}
	gcra := byKey["messaging.path_/api/*"]
	if gcra == nil {
		t.Fatal("no rule messaging.path_/api/*")
	}
	want := sluice.Policy{ID: PolicyID("messaging.path_/api/*"), Algorithm: sluice.GCRA, Limit: 3, Window: time.Minute, Burst: 2}
	if gcra.FailureMode != failure.Open {
		t.Errorf("path_/api/* failure mode = %v, want open", gcra.FailureMode)
	}
	if r := byKey["messaging.to_number"]; r == nil || !r.Policy.ClockAligned {
		t.Errorf("to_number = %+v, want a fixed window aligned to the clock (the default)", r)
	}
	if !reflect.DeepEqual(gcra.Policy, want) {
		t.Errorf("path_/api/* policy = %+v, want %+v", gcra.Policy, want)
	}
	if r := byKey["messaging.ldap"]; r == nil || !r.Unlimited || r.Decided() {
		t.Errorf("ldap = %+v, want unlimited and not decided by the store", r)
	}
	if r := byKey["messaging.remote_address_50.0.0.5"]; r == nil || r.RequestsPerUnit != 0 || r.Decided() {
		t.Errorf("blocked address = %+v, want 0 per unit, not decided by the store", r)
	}
	if r := byKey["messaging.service.user_user-a"]; r == nil || !r.Shadow {
		t.Errorf("user-a = %+v, want shadow", r)
	}
	if r := byKey["messaging.to_number"]; r == nil || !r.DetailedMetric || r.Policy.Window != 24*time.Hour || r.Line != 16 {
		t.Errorf("to_number = %+v, want detailed_metric, a 24h window, line 16", r)
	}
	if r := byKey["messaging.key_2_value_2.user"]; r == nil || strings.Join(r.Replaces, ",") != "specific_limit" {
		t.Errorf("key_2 user = %+v, want it to replace specific_limit", r)
	}
	if n := len(c.Policies()); n != 8 {
		t.Errorf("Policies() has %d, want 8 (every rule but ldap and the blocked address)", n)
	}
	for _, p := range c.Policies() {
		if err := p.Validate(); err != nil {
			t.Errorf("policy %q: %v", p.ID, err)
		}
	}
}

func TestPolicyID(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"messaging.to_number", "messaging.to_number"},
		{"messaging.path_/api/*", "messaging.path_-api--" + "-"},
	} {
		got := PolicyID(tc.key)
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("PolicyID(%q) = %q, want prefix %q", tc.key, got, tc.want)
		}
	}
	long := "d." + strings.Repeat("k", 100)
	a, b := PolicyID(long), PolicyID(long+"x")
	if len(a) > 64 || a == b {
		t.Errorf("PolicyID of long keys = %q, %q: want distinct IDs of at most 64 bytes", a, b)
	}
	// Sanitizing must not merge keys: "/" and "*" both become "-".
	if PolicyID("d.p_/a") == PolicyID("d.p_*a") {
		t.Errorf("PolicyID merges keys that differ only in replaced bytes")
	}
	for _, k := range []string{long, "d.p_/a", "d.ü", "d.k"} {
		if err := (sluice.Policy{ID: PolicyID(k), Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Second}).Validate(); err != nil {
			t.Errorf("PolicyID(%q) = %q is not a valid ID: %v", k, PolicyID(k), err)
		}
	}
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile("testdata/valid/messaging.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte("domain: d\ndescriptors: [{key: k, value: 'a*', rate_limit: {unit: second, requests_per_unit: 1}}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse([]Source{{Name: "f.yaml", Data: data}})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse error %v is not an *Error", err)
			}
			return
		}
		for _, p := range c.Policies() {
			if err := p.Validate(); err != nil {
				t.Fatalf("Parse accepted an invalid policy: %v", err)
			}
		}
	})
}

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"value*", "value", true},
		{"value*", "valueXYZ", true},
		{"value*", "valu", false},
		{"/api/*/action", "/api/123/action", true},
		{"/api/*/action", "/api//action", true},
		{"/api/*/action", "/api/user-id/action", true},
		{"/api/*/action", "/api/123/other", false},
		{"/api/*/action", "/api/action", false}, // prefix and suffix may not overlap
		{"/api/*/resource/*/action", "/api/v1/resource/123/action", true},
		{"/api/*/resource/*/action", "/api/v1/resource/action", false},
		{"a*b*b", "abb", true},
		{"a*b*b", "ab", false},
		{"*", "", true},
		{"**", "x", true},
		{"*x*", "abxcd", true},
		{"*x*", "abcd", false},
	} {
		if got := wildcardMatch(strings.Split(tc.pattern, "*"), tc.value); got != tc.want {
			t.Errorf("wildcardMatch(%q, %q) = %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}

// TestReadmeExamples loads every rules file of envoyproxy/ratelimit's
// README (testdata/readme, copied unchanged) and matches the descriptors
// each example names to the rule and the subject it documents.
func TestReadmeExamples(t *testing.T) {
	files, err := filepath.Glob("testdata/readme/*.yaml")
	if err != nil || len(files) != 16 {
		t.Fatalf("testdata/readme holds %d files (%v), want the 16 blocks of Examples 1 to 11", len(files), err)
	}
	for _, f := range files {
		if _, err := Load([]string{f}); err != nil {
			t.Errorf("Load(%s): %v", f, err)
		}
	}
	e := func(kv ...string) []Entry {
		var es []Entry
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, Entry{kv[i], kv[i+1]})
		}
		return es
	}
	for _, tc := range []struct {
		file, domain string
		entries      []Entry
		rule         string // Rule.Key; "" for none
		rpu          int64
		vars         string
	}{
		{"example01", "mongo_cps", e("database", "users"), "mongo_cps.database_users", 500, "[]"},
		{"example02", "messaging", e("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number", 5, "[{to_number 2061111111}]"},
		{"example02", "messaging", e("to_number", "2061111111"), "messaging.to_number", 100, "[{to_number 2061111111}]"},
		{"example03", "edge_proxy_per_ip", e("remote_address", "50.0.0.1"), "edge_proxy_per_ip.remote_address", 10, "[{remote_address 50.0.0.1}]"},
		{"example03", "edge_proxy_per_ip", e("remote_address", "50.0.0.5"), "edge_proxy_per_ip.remote_address_50.0.0.5", 0, "[]"},
		{"example04a", "example4", e("key", "value", "subkey", "subvalue"), "", 0, ""},
		{"example04b", "example4", e("key", "value", "subkey", "subvalue"), "example4.key_value.subkey", 300, "[{subkey subvalue}]"},
		{"example05", "internal", e("ldap", "x"), "internal.ldap", 0, "[{ldap x}]"},
		{"example06", "example6", e("service", "auth-service", "user", "user-a"), "example6.service.user_user-a", 10, "[{service auth-service}]"},
		{"example07", "example7", e("key_2", "value_2", "user", "bkthomps"), "example7.key_2_value_2.user_bkthomps", 10, "[]"},
		{"example08", "example8", e("key1", "unspecified_value"), "example8.key1", 10, "[{key1 unspecified_value}]"},
		{"example08", "example8", e("key1", "value1"), "example8.key1_value1", 20, "[]"},
		{"example09a", "example9", e("key1", "valueXYZ"), "example9.key1_value*", 20, "[{key1 valueXYZ}]"},
		{"example09b", "example9", e("path", "/api/123/action"), "example9.path_/api/*/action", 20, "[{path /api/123/action}]"},
		{"example09b", "example9", e("path", "/api/123/other"), "", 0, ""},
		{"example09c", "example9", e("route", "/api/v2/resource/456/action"), "example9.route_/api/*/resource/*/action", 20, "[{route /api/v2/resource/456/action}]"},
		{"example10a", "example10", e("route", "api", "http_method", "GET", "subject_id", "123"), "example10.route.http_method.subject_id", 60, "[{route api} {http_method GET} {subject_id 123}]"},
		{"example10b", "example10_wildcard", e("user", "alice", "action", "readfile", "resource", "documents"), "example10_wildcard.user.action_read*.resource", 100, "[{user alice} {action readfile} {resource documents}]"},
		// share_threshold: the wildcard's values are one budget.
		{"example11a", "example11", e("files", "files/a.pdf"), "example11.files_files/*", 10, "[]"},
		{"example11a", "example11", e("files_no_share", "files_no_share/a.pdf"), "example11.files_no_share_files_no_share/*", 10, "[{files_no_share files_no_share/a.pdf}]"},
		{"example11b", "example11_metrics", e("route", "api/v1", "method", "GET"), "example11_metrics.route_api/*.method", 60, "[{method GET}]"},
	} {
		c, err := Load([]string{filepath.Join("testdata", "readme", tc.file+".yaml")})
		if err != nil {
			t.Fatal(err)
		}
		r, vars := c.Match(tc.domain, tc.entries)
		got := ""
		if r != nil {
			got = r.Key
		}
		if got != tc.rule {
			t.Errorf("%s: Match(%v) = rule %q, want %q", tc.file, tc.entries, got, tc.rule)
			continue
		}
		if r == nil {
			continue
		}
		if r.RequestsPerUnit != tc.rpu || fmtEntries(vars) != tc.vars {
			t.Errorf("%s: Match(%v) = %d per unit, vars %s; want %d, %s", tc.file, tc.entries, r.RequestsPerUnit, fmtEntries(vars), tc.rpu, tc.vars)
		}
		if r.Decided() && !r.Policy.ClockAligned {
			t.Errorf("%s: rule %s is not aligned to the clock", tc.file, r.Key)
		}
	}
}
