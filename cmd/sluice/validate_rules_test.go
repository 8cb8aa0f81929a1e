package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestValidateRulesFilesWhole: a rules file with seven different
// mistakes (and two warnings: TestValidateWarnings) gives seven errors in
// one validate run, sorted by file and
// line, each with its field, value and rule; a second file's problem
// follows the first file's.
func TestValidateRulesFilesWhole(t *testing.T) {
	cfg := writeConfig(t, `envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
`)
	dir := filepath.Join(filepath.Dir(cfg), "rules")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", `domain: shop
descriptors:
  - key: user
    rate_limit: { unit: fortnight, requests_per_unit: -5 }
  - key: plan
    shadow_mode: yes please
    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: concurrency }
  - key: plan
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: path
    value: "/api/*"
    rate_limit: { unit: hour, requests_per_unit: 5, failure_mode: sometimes }
  - key: path
    value: "/api/v1/*"
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: api
    rate_limits: { unit: hour, requests_per_unit: 5 }
  - key: team
    rate_limit:
      unit: hour
      requests_per_unit: 5
      replaces: [{ name: no_such_rule }]
`)
	write("b.yaml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: many }\n")
	var out, errOut bytes.Buffer
	if code := exitCode(run(context.Background(), []string{"validate", "-c", cfg}, &out, &errOut), &errOut); code != 1 {
		t.Fatalf("validate exited %d, want 1; stderr %q", code, errOut.String())
	}
	prefix := "sluice: envoy.configs (" + cfg + " line 3): "
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
		got = append(got, strings.TrimPrefix(l, prefix))
	}
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	want := []string{
		a + `: descriptors[0].rate_limit.unit: "fortnight": must be one of second, minute, hour, day, week, month, year (line 4)`,
		a + `: descriptors[0].rate_limit.requests_per_unit: -5: must be between 0 and 4294967295 (line 4)`,
		a + `: descriptors[1].shadow_mode: "yes please": must be true or false (line 6)`,
		a + `: descriptors[1].rate_limit.algorithm: "concurrency": is not an algorithm of the Envoy service: an in-flight limit is sluice_in_flight: {limit: N, lease_ttl: D} on a descriptor whose value names the request (docs/envoy.md, In-flight limits) (line 7)`,
		a + `: descriptors[2].key: "plan": duplicate descriptor: shop.plan is already defined at this level (line 8)`,
		a + `: descriptors[3].rate_limit.failure_mode: "sometimes": must be one of closed, open (local needs a per-instance share, which the Envoy service does not have) (line 12)`,
		a + `: descriptors[5].rate_limits: unknown key: must be one of key, value, rate_limit, shadow_mode, detailed_metric, value_to_metric, share_threshold, metadata, quota_mode, descriptors (line 17)`,
		b + `: descriptors[0].rate_limit.requests_per_unit: "many": must be an integer (line 4)`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("validate's problems (-want +got):\n%s", diff)
	}
}

// TestValidateWarnings: what envoyproxy/ratelimit loads, validate passes:
// a wildcard the one above it covers (their "the first listed wins") and
// a replaces naming no rule are warnings on stdout with their line, and
// validate exits 0; --strict refuses them, each named.
func TestValidateWarnings(t *testing.T) {
	cfg := writeConfig(t, `envoy:
  listen: "127.0.0.1:0"
  configs: ["shop.yaml"]
`)
	rules := filepath.Join(filepath.Dir(cfg), "shop.yaml")
	if err := os.WriteFile(rules, []byte(`domain: shop
descriptors:
  - { key: path, value: "ab*", rate_limit: { unit: hour, requests_per_unit: 5 } }
  - { key: path, value: "abc*", rate_limit: { unit: hour, requests_per_unit: 9 } }
  - key: team
    rate_limit: { unit: hour, requests_per_unit: 5, replaces: [{ name: no_such_rule }] }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	prefix := "envoy.configs (" + cfg + " line 3): " + rules
	want := []string{
		prefix + `: descriptors[1].value: "abc*": can never match: the wildcard "ab*" above it (line 3) matches every value this one does, and the first wildcard that matches wins (line 4)`,
		prefix + `: descriptors[2].rate_limit.replaces[0].name: "no_such_rule": names no rate_limit of this domain: it replaces nothing (a typo here leaves both limits applied) (line 6)`,
	}
	var out, errOut bytes.Buffer
	if code := exitCode(run(context.Background(), []string{"validate", "-c", cfg}, &out, &errOut), &errOut); code != 0 {
		t.Fatalf("validate exited %d, want 0; stderr %q", code, errOut.String())
	}
	if got, w := out.String(), "warning: "+want[0]+"\nwarning: "+want[1]+"\nok\n"; got != w {
		t.Errorf("validate printed %q, want %q", got, w)
	}
	out.Reset()
	errOut.Reset()
	if code := exitCode(run(context.Background(), []string{"validate", "--strict", "-c", cfg}, &out, &errOut), &errOut); code != 1 || out.Len() != 0 {
		t.Fatalf("validate --strict exited %d, printed %q; want 1 and nothing on stdout", code, out.String())
	}
	for _, w := range want {
		if !strings.Contains(errOut.String(), w) {
			t.Errorf("validate --strict said %q, want it to name %q", errOut.String(), w)
		}
	}
}

// TestValidateEnvoyOverride: an override naming an Envoy subject is
// matched to the rules files by validate: a descriptor no rule matches,
// or numbers its rule's policy does not take, is reported with its line.
func TestValidateEnvoyOverride(t *testing.T) {
	for _, tc := range []struct{ override, want string }{
		{`{ envoy: { domain: shop, entries: [{ key: nope, value: x }] }, limit: 5 }`, `overrides[0].envoy: descriptor (nope=…): no rule of domain "shop" matches it (line 10)`},
		{`{ envoy: { domain: shop, entries: [{ key: user, value: x }] }, limit: 5, burst: 9 }`, `overrides[0].burst: 9: applies only to token_bucket and gcra; leave it unset for fixed_window (line 10)`},
		{`{ policy: other, envoy: { domain: shop, entries: [{ key: user, value: x }] }, limit: 5 }`, `overrides[0].policy: "other": the descriptor's rule has policy "shop.user"`},
		{`{ proxy: { route: 0, header: acme }, limit: 5 }`, `overrides[0].proxy.header: route 0: its subject is ip, not a header (line 10)`},
		{`{ proxy: { route: 0, ip: 203.0.113.9 }, limit: 0 }`, `overrides[0].limit: 0: must be at least 1 (line 10)`},
	} {
		cfg := writeConfig(t, `envoy:
  listen: "127.0.0.1:0"
  configs: ["shop.yaml"]
policies: [{ id: login, algorithm: fixed_window, limit: 3, window: 1m }]
proxy:
  listen: "127.0.0.1:0"
  upstream: "http://127.0.0.1:9"
  routes: [{ match: { path_prefix: / }, policies: [login], subject: ip }]
overrides:
  - `+tc.override+`
`)
		if err := os.WriteFile(filepath.Join(filepath.Dir(cfg), "shop.yaml"), []byte("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		code := exitCode(run(context.Background(), []string{"validate", "-c", cfg}, &out, &errOut), &errOut)
		if code != 1 || !strings.Contains(errOut.String(), cfg+": "+tc.want) {
			t.Errorf("validate with override %s = exit %d %q, want 1 and %q", tc.override, code, errOut.String(), tc.want)
		}
	}
}

// TestValidateRLQSWarnings: an RLQS matcher an earlier one shadows loads
// (validate prints a warning with its line and exits 0); --strict
// refuses it. A config with envoy.rlqs needs no rules files.
func TestValidateRLQSWarnings(t *testing.T) {
	cfg := writeConfig(t, `policies: [{id: p, algorithm: token_bucket, limit: 10, window: 1s, burst: 136}]
envoy:
  listen: "127.0.0.1:0"
  rlqs:
    domains:
      - domain: edge
        buckets:
          - {match: {tenant: "*"}, policy: p}
          - {match: {tenant: acme}, policy: p}
`)
	want := cfg + `: envoy.rlqs.domains[0].buckets[1].match: can never match: buckets[0] above it (line 8) matches every bucket id this one does, and the first match wins (line 9)`
	var out, errOut bytes.Buffer
	if code := exitCode(run(context.Background(), []string{"validate", "-c", cfg}, &out, &errOut), &errOut); code != 0 {
		t.Fatalf("validate exited %d, want 0; stderr %q", code, errOut.String())
	}
	if got, w := out.String(), "warning: "+want+"\nok\n"; got != w {
		t.Errorf("validate printed %q, want %q", got, w)
	}
	out.Reset()
	errOut.Reset()
	if code := exitCode(run(context.Background(), []string{"validate", "--strict", "-c", cfg}, &out, &errOut), &errOut); code != 1 || !strings.Contains(errOut.String(), want) {
		t.Errorf("validate --strict exited %d, said %q; want 1 naming %q", code, errOut.String(), want)
	}
}

// TestValidateRLQSSmallBurst: a matcher whose policy's burst gives an
// idle Envoy's floor share among 16 less than one token (b < 136) loads,
// and validate says so with the matcher's line and the least burst that
// does, then ok (exit 0): the split answers such a floor DENY_ALL.
func TestValidateRLQSSmallBurst(t *testing.T) {
	cfg := writeConfig(t, `policies: [{id: per-tenant, algorithm: token_bucket, limit: 100, window: 1s}]
envoy:
  listen: "127.0.0.1:0"
  rlqs:
    domains:
      - domain: edge
        buckets:
          - {match: {tenant: "*"}, policy: per-tenant}
`)
	var out, errOut bytes.Buffer
	if code := exitCode(run(context.Background(), []string{"validate", "-c", cfg}, &out, &errOut), &errOut); code != 0 {
		t.Fatalf("validate exited %d, want 0; stderr %q", code, errOut.String())
	}
	want := "warning: " + cfg + `: envoy.rlqs.domains[0].buckets[0].policy: "per-tenant": has burst 100 (the default: its limit): ` +
		"among 16 Envoys an idle or new one's floor share (1/136 of the policy) is too small for a token bucket, so it gets DENY_ALL until its demand earns it a share; set burst to at least 136 (line 8)\nok\n"
	if got := out.String(); got != want {
		t.Errorf("validate printed %q, want %q", got, want)
	}
}
