package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestOverridePutReadsNoPlans: a PUT /v1/overrides on Redis sends the
// same commands whatever the number of plans, and none of them reads the
// plans back (the cap is counted in Redis, in the script that writes).
// Before, each PUT read the whole hash (HGETALL, 1 MB at 10 000 plans) to
// count it: 10 000 PUTs took 151–170 s.
func TestOverridePutReadsNoPlans(t *testing.T) {
	srv := redistest.Standalone(t)
	url := startOverrideServer(t, overridesConfig(fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr)))
	admin := srv.Client()
	t.Cleanup(func() { admin.Close() })
	spend(t, url, "warm", 1) // a check waits for the server's first read of the plans: done before counting
	put := func(i int) {
		t.Helper()
		body := fmt.Sprintf(`{"policy":"api","subject":"tenant-%d","limit":100,"note":"plan %d"}`, i, i)
		if code, answer := call(t, "PUT", url+"/v1/overrides", ovrAdminToken, body); code != 200 {
			t.Fatalf("PUT %s = %d %s", body, code, answer)
		}
	}
	// perPut returns the commands Redis ran for each of 10 PUTs, by name.
	next := 0
	perPut := func() map[string]float64 {
		t.Helper()
		if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			put(next)
			next++
		}
		return commandCalls(t, admin, 10)
	}
	put(next) // the first loads the script
	next++
	small := perPut()
	for next < 200 {
		put(next)
		next++
	}
	large := perPut()
	for _, name := range []string{"hgetall", "hkeys", "hvals", "hscan"} {
		if large[name] != 0 || small[name] != 0 {
			t.Errorf("%s per PUT = %v at 10 plans, %v at 200, want 0: a PUT must not read every plan", name, small[name], large[name])
		}
	}
	for name, n := range large {
		if small[name] != n {
			t.Errorf("%s per PUT = %v at 10 plans, %v at 200, want the same", name, small[name], n)
		}
	}
}

// commandCalls reads INFO commandstats: the calls of each command since
// the last CONFIG RESETSTAT, divided by n, INFO and CONFIG and PING left
// out (the harness's and the readiness probe's).
func commandCalls(t *testing.T, c *redis.Client, n int) map[string]float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]float64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || name == "info" || name == "config|resetstat" || name == "ping" {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				k, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("commandstats %q: %v", line, err)
				}
				calls[name] = float64(k) / float64(n)
			}
		}
	}
	return calls
}

// BenchmarkOverridePuts measures what 10 000 plan PUTs cost on Redis, as
// issue 50 counts it: the median PUT while 10 plans are set beside the
// median while the last 10 of 10 000 go in, in one run, over a real
// socket to a server wired as sluice serve wires it (its HTTP client
// plain, no OpenAPI check). One iteration is the 10 000 PUTs:
//
//	go test -run '^$' -bench OverridePuts -benchtime 1x ./internal/server
func BenchmarkOverridePuts(b *testing.B) {
	const plans = 10_000
	srv := redistest.Standalone(b)
	url := startOverrideServer(b, overridesConfig(fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr)))
	admin := srv.Client()
	b.Cleanup(func() { admin.Close() })
	client := &http.Client{}
	put := func(run, i int) time.Duration {
		body := fmt.Sprintf(`{"policy":"api","subject":"tenant-%d-%d","limit":100,"note":"plan %d"}`, run, i, i)
		req, _ := http.NewRequest("PUT", url+"/v1/overrides", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+ovrAdminToken)
		began := time.Now()
		resp, err := client.Do(req)
		took := time.Since(began)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("PUT %s = %d", body, resp.StatusCode)
		}
		return took
	}
	median := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	for run := 0; b.Loop(); run++ {
		if err := admin.FlushAll(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
		took := make([]time.Duration, plans)
		for i := range took {
			took[i] = put(run, i)
		}
		first, last := median(took[:20]), median(took[plans-20:])
		b.ReportMetric(float64(first.Microseconds()), "µs-p50-at-10")
		b.ReportMetric(float64(last.Microseconds()), "µs-p50-at-10000")
		b.ReportMetric(float64(last)/float64(first), "ratio")
	}
}
