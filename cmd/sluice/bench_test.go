package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// runBench runs sluice bench with args and --json and decodes its summary.
func runBench(t *testing.T, args ...string) bench.Report {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"bench", "--json"}, args...)
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("sluice %s: %v\nstderr: %s", strings.Join(args, " "), err, errOut.String())
	}
	var rep bench.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("sluice %s printed %q: %v", strings.Join(args, " "), out.String(), err)
	}
	if rep.Decisions != rep.Allowed+rep.Denied {
		t.Errorf("decisions = %d, want allowed %d + denied %d", rep.Decisions, rep.Allowed, rep.Denied)
	}
	return rep
}

// With 10 per hour, every subject gets exactly 10 admissions in a short
// run, whatever the algorithm and however many callers race for them.
func TestBenchMemoryCounts(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_log", "sliding_window", "token_bucket", "gcra"} {
		t.Run(alg, func(t *testing.T) {
			rep := runBench(t, "--store", "memory", "--policy-algorithm", alg, "--limit", "10", "--window", "1h",
				"--subjects", "2", "--callers", "4", "--duration", "200ms")
			if rep.Allowed != 20 || rep.Other != 0 {
				t.Errorf("bench %s, 10 per hour, 2 subjects: allowed %d, other %d (%v); want 20 allowed, 0 other", alg, rep.Allowed, rep.Other, rep.OtherKinds)
			}
			if rep.Target != "memory" || rep.Algorithm != alg || rep.Limit != 10 || rep.Callers != 4 || rep.Subjects != 2 {
				t.Errorf("bench summary = %+v, want it to describe the run", rep)
			}
		})
	}
}

func TestBenchTable(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"bench", "--limit", "5", "--window", "1h", "--subjects", "1", "--callers", "2", "--duration", "100ms"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("sluice bench: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"target       memory", "policy       bench: gcra, 5 per 1h0m0s, burst 5", "decisions/s", "other        0\n", "p99.9"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("sluice bench printed\n%s\nwant it to contain %q", out.String(), want)
		}
	}
	// Exactly the limit is allowed, once the run took that many decisions:
	// a loaded machine may give the two callers fewer in 100ms, which the
	// table must report as they were.
	var allowed, denied int64
	if _, err := fmt.Sscanf(out.String()[strings.Index(out.String(), "allowed"):], "allowed %d\ndenied %d", &allowed, &denied); err != nil {
		t.Fatalf("sluice bench printed\n%s\nwithout allowed and denied rows: %v", out.String(), err)
	}
	if allowed != min(5, allowed+denied) {
		t.Errorf("sluice bench printed allowed %d, denied %d; want allowed 5 (or every decision, when fewer than 5)", allowed, denied)
	}
}

// Against a real Redis: the counts hold across the store, the run's keys
// live under a prefix of their own and are gone afterwards, and a key that
// was there before is untouched.
func TestBenchRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "app:keep", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rep := runBench(t, "--store", "redis", "--redis-url", fmt.Sprintf("redis://%s/0", srv.Addr), "--policy-algorithm", "sliding_log",
		"--limit", "10", "--window", "1h", "--subjects", "3", "--callers", "8", "--duration", "300ms")
	if rep.Allowed != 30 || rep.Other != 0 {
		t.Errorf("bench on redis, 10 per hour, 3 subjects: allowed %d, other %d (%v, %s); want 30, 0", rep.Allowed, rep.Other, rep.OtherKinds, rep.FirstError)
	}
	if rep.KeysDeleted != 3 {
		t.Errorf("bench deleted %d keys, want 3 (one state key per subject)", rep.KeysDeleted)
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != "[app:keep]" {
		t.Errorf("keys after bench = %q, want only the key that was there before", keys)
	}
}

func TestBenchServer(t *testing.T) {
	s := startServe(t, "-c", writeConfig(t, demoConfig))
	rep := runBench(t, "--url", s.url, "--policy", "demo", "--subjects", "1", "--callers", "4", "--duration", "200ms")
	if rep.Allowed != 3 || rep.Other != 0 {
		t.Errorf("bench --url with the 3-per-hour demo policy: allowed %d, other %d (%s); want 3, 0", rep.Allowed, rep.Other, rep.FirstError)
	}
	// Every answer an error: the summary still prints, and the exit status
	// says the run measured nothing, naming the first error (whether the
	// run stopped early, after 100 answers, depends on the machine's pace).
	var out, errOut bytes.Buffer
	args := []string{"bench", "--json", "--url", s.url, "--policy", "nope", "--subjects", "1", "--callers", "1", "--duration", "50ms"}
	code := exitCode(run(context.Background(), args, &out, &errOut), &errOut)
	var rep2 bench.Report
	if err := json.Unmarshal(out.Bytes(), &rep2); err != nil {
		t.Fatalf("sluice %s printed %q: %v", strings.Join(args, " "), out.String(), err)
	}
	if code != 1 || rep2.Decisions != 0 || rep2.Other == 0 || !strings.Contains(errOut.String(), "were errors, more than --max-errors 0.01") || !strings.Contains(errOut.String(), "; the first: POST "+s.url+"/v1/check: 404 Not Found") {
		t.Errorf("bench --url with an unknown policy: exit %d, %+v, stderr %q; want exit 1, no decisions, the first 404 named", code, rep2, errOut.String())
	}
}

// TestBenchServerTLSWithToken: --token-env and --ca-file bench a server
// with TLS and tokens (without them every answer was a 401); and a run
// whose answers are all errors stops after the first 100 rather than
// running out its --duration.
func TestBenchServerTLSWithToken(t *testing.T) {
	certFile, keyFile, _ := writeCert(t, t.TempDir())
	t.Setenv("SLUICE_TEST_BENCH_TOKEN", "bench-token-0123456789")
	cfg := writeConfig(t, `
server:
  listen: "127.0.0.1:0"
  tls: { cert_file: "`+certFile+`", key_file: "`+keyFile+`" }
  auth:
    tokens:
      - { id: bench, secret_env: SLUICE_TEST_BENCH_TOKEN, scopes: [check] }
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
`)
	s := startServe(t, "-c", cfg)
	rep := runBench(t, "--url", s.url, "--policy", "demo", "--token-env", "SLUICE_TEST_BENCH_TOKEN", "--ca-file", certFile, "--subjects", "1", "--callers", "2", "--duration", "200ms")
	if rep.Allowed != 3 || rep.Other != 0 {
		t.Errorf("bench --token-env --ca-file against TLS and tokens: allowed %d, other %d (%s); want 3, 0", rep.Allowed, rep.Other, rep.FirstError)
	}

	var out, errOut bytes.Buffer
	unset := []string{"bench", "--url", s.url, "--policy", "demo", "--token-env", "SLUICE_TEST_UNSET_TOKEN"}
	if code := exitCode(run(context.Background(), unset, &out, &errOut), &errOut); code != 1 || !strings.Contains(errOut.String(), "--token-env SLUICE_TEST_UNSET_TOKEN: the environment variable is unset or empty") {
		t.Errorf("sluice %s: exit %d, stderr %q; want 1 naming the unset variable", strings.Join(unset, " "), code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	args := []string{"bench", "--json", "--url", s.url, "--policy", "demo", "--ca-file", certFile, "--subjects", "1", "--callers", "2", "--duration", "1h"}
	code := exitCode(run(context.Background(), args, &out, &errOut), &errOut)
	var rep2 bench.Report
	if err := json.Unmarshal(out.Bytes(), &rep2); err != nil {
		t.Fatalf("sluice %s printed %q: %v", strings.Join(args, " "), out.String(), err)
	}
	if code != 1 || !rep2.StoppedEarly || rep2.Decisions != 0 || rep2.Other < 100 || rep2.Other > 102 ||
		!strings.Contains(errOut.String(), "stopped early") || !strings.Contains(errOut.String(), "401 Unauthorized") {
		t.Errorf("bench --duration 1h without the token: exit %d, %+v, stderr %q; want exit 1 after the first 100 answers (all 401), stopped early", code, rep2, errOut.String())
	}
}

// The modes: allowed admits nearly everything, denied only each
// subject's first, mixed about half; the header line on stderr says
// which.
func TestBenchModes(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		header string
		ok     func(rep bench.Report) bool
	}{
		{"allowed", "mode allowed: nearly every decision is allowed", func(r bench.Report) bool { return r.Denied == 0 && r.Allowed > 0 }},
		{"denied", "mode denied: every decision after a subject's first is denied", func(r bench.Report) bool { return r.Allowed <= 4 && r.Denied > 0 }},
		{"mixed", "mode mixed: about half the decisions are allowed", func(r bench.Report) bool {
			return r.Allowed > 0 && r.Denied > 0 && r.Allowed > r.Denied/2 && r.Denied > r.Allowed/2
		}},
	} {
		var out, errOut bytes.Buffer
		args := []string{"bench", "--json", "--mode", tc.mode, "--subjects", "4", "--callers", "2", "--duration", "200ms"}
		if err := run(context.Background(), args, &out, &errOut); err != nil {
			t.Fatalf("sluice %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
		var rep bench.Report
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		if !tc.ok(rep) || rep.Mode != tc.mode {
			t.Errorf("bench --mode %s: mode %q, allowed %d, denied %d", tc.mode, rep.Mode, rep.Allowed, rep.Denied)
		}
		if first, _, _ := strings.Cut(errOut.String(), "\n"); !strings.Contains(first, tc.header) {
			t.Errorf("bench --mode %s: first stderr line %q, want it to say %q", tc.mode, first, tc.header)
		}
	}
	// Without flags the mode is allowed, and the header says so.
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"bench", "--duration", "100ms", "--callers", "1"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(errOut.String(), "sluice bench: mode allowed: nearly every decision is allowed") {
		t.Errorf("bench without flags: stderr %q, want the allowed mode's header first", errOut.String())
	}
}

func TestBenchUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "disk"}, `--store "disk": want memory or redis`},
		{[]string{"--store", "redis"}, "--store redis needs --redis-url"},
		{[]string{"--redis-url", "redis://127.0.0.1:1/0"}, "need --store redis"},
		{[]string{"--store", "redis", "--redis-addrs", "a:1,b:2"}, "--redis-addrs needs --redis-mode cluster"},
		{[]string{"--url", "http://127.0.0.1:1", "--limit", "5"}, "--url uses the server's policy"},
		{[]string{"--url", "127.0.0.1:1", "--policy", "demo"}, "want http://host:port"},
		{[]string{"--url", "http://127.0.0.1:1"}, "--url needs --policy ID"},
		{[]string{"--mode", "most"}, `--mode "most": want allowed, denied or mixed`},
		{[]string{"--mode", "denied", "--limit", "5"}, "--mode picks the policy's numbers"},
		{[]string{"--max-errors", "2"}, "--max-errors 2: want a share from 0 to 1"},
		{[]string{"--policy-algorithm", "leaky"}, `unknown algorithm "leaky"`},
		{[]string{"--limit", "0"}, "limit = 0"},
		{[]string{"--callers", "0"}, "--callers 0"},
		{[]string{"--duration", "0s"}, "--duration 0s"},
		{[]string{"--token-env", "T"}, "--token-env and --ca-file are for a server: they need --url"},
		{[]string{"--url", "http://127.0.0.1:1", "--policy", "demo", "--ca-file", "ca.pem"}, "--ca-file an https:// one"},
	} {
		var out, errOut bytes.Buffer
		code := exitCode(run(context.Background(), append([]string{"bench"}, tc.args...), &out, &errOut), &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("sluice bench %q: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// On a cluster the run's keys spread over every master (one hash tag per
// subject), and the cleanup finds and deletes them on each.
func TestBenchRedisCluster(t *testing.T) {
	redistest.Long(t)
	cl := redistest.Cluster(t)
	rep := runBench(t, "--store", "redis", "--redis-addrs", strings.Join(cl.Addrs, ","), "--redis-mode", "cluster",
		"--policy-algorithm", "fixed_window", "--limit", "10", "--window", "1h", "--subjects", "30", "--callers", "8", "--duration", "500ms")
	if rep.Other != 0 {
		t.Fatalf("bench on a cluster: %d without a decision (%v), the first: %s", rep.Other, rep.OtherKinds, rep.FirstError)
	}
	// Callers pick subjects at random: in a short run on a slow machine a
	// subject may not come up at all, but none gets more than 10.
	if rep.Allowed > 10*rep.KeysDeleted || rep.KeysDeleted > 30 || rep.KeysDeleted == 0 {
		t.Errorf("bench on a cluster, 10 per hour, 30 subjects: allowed %d, keys deleted %d; want 1 to 30 keys and at most 10 allowed per key", rep.Allowed, rep.KeysDeleted)
	}
	c := cl.Client()
	defer c.Close()
	ctx := context.Background()
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		keys, err := m.Keys(ctx, "*").Result()
		if err == nil && len(keys) > 0 {
			err = fmt.Errorf("master %s still holds %q", m.Options().Addr, keys)
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

// When stderr is not a terminal, bench writes a plain progress line every
// second for a run under 10 s: answers, rate, p99, errors, time left.
func TestBenchProgressLines(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"bench", "--duration", "1500ms", "--callers", "1", "--subjects", "2"}, &out, &errOut); err != nil {
		t.Fatalf("sluice bench: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	if len(lines) < 2 {
		t.Fatalf("bench stderr %q: want the header and at least one progress line", errOut.String())
	}
	for _, want := range []string{"sluice bench: 1", "of 1.5s, ", " answers, ", "/s, p99 ", ", 0 errors, ", " left"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("progress line %q, want it to contain %q", lines[1], want)
		}
	}
}
