package deploy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// floodSubjectsEnv sets how many distinct subjects TestChartDefaultsHoldAFlood
// sends; issue 50's figure, 2 000 000, takes about three minutes on two
// idle cores, so the default sends enough to fill the bound the chart's
// GOMEMLIMIT derives (86 133 states) twice over.
const floodSubjectsEnv = "SLUICE_FLOOD_SUBJECTS"

// chartDefaults are the values of deploy/helm/sluice/values.yaml that decide
// the memory of a pod on the embedded store.
type chartDefaults struct {
	Store struct {
		Type   string
		Memory struct {
			MaxKeys int64 `yaml:"maxKeys"`
		}
	}
	Policies   []map[string]any
	GoMemLimit string `yaml:"goMemLimit"`
	Resources  struct {
		Limits struct {
			Memory string
		}
	}
}

// TestChartDefaultsHoldAFlood is issue 50's flood: a sluice serve run as the
// chart runs it by default (the embedded store, the chart's policies and
// store.memory, GOMEMLIMIT from goMemLimit) is sent distinct subjects over
// POST /v1/check, each request naming both policies and an evaluation id of
// its own (the most memory a request can leave), from 48 keep-alive
// callers. The process must answer every request, stay alive, and peak
// (VmHWM) under the chart's memory limit; the store must have evicted, so
// the flood did reach its bound. The kernel's limit itself is not applied
// (no cgroup here): the peak is compared with it.
func TestChartDefaultsHoldAFlood(t *testing.T) {
	redistest.Long(t)
	subjects := 200_000
	if v := os.Getenv(floodSubjectsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of subjects", floodSubjectsEnv, v)
		}
		subjects = n
	}
	var values chartDefaults
	raw, err := os.ReadFile(filepath.Join("helm", "sluice", "values.yaml"))
	if err == nil {
		err = yaml.Unmarshal(raw, &values)
	}
	if err != nil {
		t.Fatal(err)
	}
	limit := quantity(t, values.Resources.Limits.Memory)
	if values.Store.Type != "memory" || values.GoMemLimit == "" || limit == 0 {
		t.Fatalf("the chart's defaults: store %q, goMemLimit %q, memory limit %q; want the embedded store under both limits", values.Store.Type, values.GoMemLimit, values.Resources.Limits.Memory)
	}
	cfg := map[string]any{
		"server":   map[string]any{"listen": "127.0.0.1:0"},
		"store":    map[string]any{"type": "memory"},
		"subjects": map[string]any{"hmac_keys": []any{map[string]any{"id": "k1", "secret_env": "SLUICE_HMAC_K1"}}},
		"policies": values.Policies,
	}
	if values.Store.Memory.MaxKeys > 0 {
		cfg["store"] = map[string]any{"type": "memory", "memory": map[string]any{"max_keys": values.Store.Memory.MaxKeys}}
	}
	out, _ := yaml.Marshal(cfg)
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOMEMLIMIT", values.GoMemLimit) // the child inherits it, as the pod's container does
	t.Setenv("SLUICE_HMAC_K1", strings.Repeat("k", 32))
	p := startProcess(t, sluiceBinary(t), path)
	ids := make([]string, 0, len(values.Policies))
	for _, pol := range values.Policies {
		ids = append(ids, fmt.Sprint(pol["id"]))
	}
	start := time.Now()
	failed := flood(t, p.URL, ids, subjects, 48)
	took := time.Since(start)
	select {
	case <-p.Exited():
		t.Fatalf("sluice serve exited during the flood: %v\n%s", p.Err(), p.Logs())
	default:
	}
	if got := get(t, p.URL+"/healthz"); !strings.Contains(got, "ok") {
		t.Errorf("GET /healthz after the flood = %q, want ok", got)
	}
	peak := vmHWM(t, p.PID())
	metrics := get(t, p.URL+"/metrics")
	evictions, heap := metric(metrics, "sluice_store_evictions_total"), metric(metrics, "go_memstats_heap_inuse_bytes")
	t.Logf("%d subjects in %v (%.0f checks/s) under GOMEMLIMIT %s: peak RSS %d MiB of the chart's %s limit; heap in use %.0f MiB; %.0f states evicted; max_keys: %s",
		subjects, took.Round(time.Second), float64(subjects)/took.Seconds(), values.GoMemLimit, peak>>20, values.Resources.Limits.Memory, heap/(1<<20), evictions, maxKeysOf(p.StartLine))
	if failed > 0 {
		t.Errorf("%d of %d checks got no 200 or 429", failed, subjects)
	}
	if peak >= limit {
		t.Errorf("peak RSS (VmHWM) %d MiB, want under the chart's memory limit %s: the pod would be OOM-killed", peak>>20, values.Resources.Limits.Memory)
	}
	if evictions == 0 {
		t.Errorf("sluice_store_evictions_total = 0: the flood never reached the store's bound, so it proved nothing")
	}
}

// flood sends one POST /v1/check per subject from callers goroutines, each
// on a keep-alive connection, and returns how many got neither 200 nor 429.
func flood(t *testing.T, base string, policies []string, subjects, callers int) int64 {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	list := `"` + strings.Join(policies, `","`) + `"`
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(subjects); i = next.Add(1) - 1 {
				body := fmt.Sprintf(`{"policies":[%s],"subject":"flood-%d","evaluation_id":"%036d"}`, list, i, i)
				resp, err := client.Post(base+"/v1/check", "application/json", bytes.NewReader([]byte(body)))
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return failed.Load()
}

// quantity reads a Kubernetes memory quantity such as 256Mi in bytes.
func quantity(t *testing.T, q string) int64 {
	t.Helper()
	for suffix, unit := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, err := strconv.ParseInt(strings.TrimSuffix(q, suffix), 10, 64); strings.HasSuffix(q, suffix) && err == nil {
			return n * unit
		}
	}
	t.Fatalf("memory limit %q: want a number of Ki, Mi or Gi", q)
	return 0
}

// vmHWM is pid's peak resident memory in bytes, from /proc/PID/status.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err) // Linux only
	}
	m := regexp.MustCompile(`(?m)^VmHWM:\s+(\d+) kB$`).FindSubmatch(status)
	if m == nil {
		t.Fatalf("/proc/%d/status has no VmHWM line:\n%s", pid, status)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// metric is the sum of a metric's samples in a /metrics page.
func metric(page, name string) float64 {
	var sum float64
	for _, line := range strings.Split(page, "\n") {
		if f := strings.Fields(line); len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum
}

// maxKeysOf is the bound the listening line names.
func maxKeysOf(line string) string {
	if m := regexp.MustCompile(`max_keys=(\d+)`).FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return "not logged"
}
