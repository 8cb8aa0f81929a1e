package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestServeSentinelFailover: sluice serve with store.redis.mode sentinel
// decides through the master three Sentinels monitor, over its check API
// on a real socket; when that master is killed and they promote its
// replica, it decides again within a bounded time, and nothing is spent
// twice: the decisions taken before (replicated: WAIT) and the one
// retried with its evaluation_id across the failover are each answered
// once, their repeats replayed.
func TestServeSentinelFailover(t *testing.T) {
	set := redistest.SentinelSet(t, "sluice-serve")
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	cfg := fmt.Sprintf(`
server: { listen: "127.0.0.1:0", decision_timeout: 2s }
store:
  type: redis
  redis: { addrs: [%q, %q, %q], mode: sentinel, master_name: sluice-serve, timeout: 1s }
policies:
  - { id: api, algorithm: sliding_log, limit: 10, window: 1h, dedupe_ttl: 10m }
`, set.Addrs()[0], set.Addrs()[1], set.Addrs()[2])
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, path, "")
	check := func(body string) (int, checkAnswer) {
		resp, err := http.Post(r.url+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a checkAnswer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			t.Fatalf("POST /v1/check %s: status %d, body: %v", body, resp.StatusCode, err)
		}
		return resp.StatusCode, a
	}
	spend := func(id string) (int, checkAnswer) {
		return check(fmt.Sprintf(`{"policy":"api","subject":"u-1","evaluation_id":%q}`, id))
	}
	for i := range 4 {
		if code, a := spend(fmt.Sprintf("before-%d", i)); code != 200 || a.Remaining != int64(9-i) {
			t.Fatalf("spend before-%d = %d %+v, want 200, remaining %d", i, code, a, 9-i)
		}
	}
	m := set.Master.Client()
	n, err := m.Wait(context.Background(), 1, 5*time.Second).Result()
	m.Close()
	if err != nil || n != 1 {
		t.Fatalf("WAIT 1 on the master = %d, %v: the replica must hold the decisions before the master dies", n, err)
	}

	set.Master.Kill()
	killed := time.Now()
	deadline := killed.Add(60 * time.Second)
	var code int
	var a checkAnswer
	seen := map[string]int{} // what the attempts before the decision answered
	for attempts := 1; ; attempts++ {
		if code, a = spend("during"); code == 200 || code == 429 {
			t.Logf("decided again %v after the master was killed, after %d attempts (before: %v): %d %+v", time.Since(killed).Round(time.Millisecond), attempts, seen, code, a)
			break
		}
		seen[fmt.Sprintf("%d %s %s", code, a.Outcome, a.Cause)]++
		if time.Now().After(deadline) {
			t.Fatalf("no decision within 60s of the master's death (%d attempts: %v); the last: %d %+v", attempts, seen, code, a)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != 200 || a.Remaining != 5 {
		t.Fatalf("spend during = %d %+v after the failover, want 200, remaining 5: the 4 replicated spends and its own", code, a)
	}
	for i := range 4 {
		if code, a := spend(fmt.Sprintf("before-%d", i)); code != 200 || !a.Replayed || a.Remaining != int64(9-i) {
			t.Fatalf("retry of before-%d after the failover = %d %+v, want its first answer replayed (remaining %d)", i, code, a, 9-i)
		}
	}
	if code, a := spend("during"); code != 200 || !a.Replayed || a.Remaining != 5 {
		t.Fatalf("retry of during = %d %+v, want its answer replayed (remaining 5)", code, a)
	}
	if code, a := check(`{"policy":"api","subject":"u-1","cost":0}`); code != 200 || a.Remaining != 5 {
		t.Fatalf("peek after the retries = %d %+v, want remaining 5: nothing spent twice", code, a)
	}
}

// checkAnswer is the part of the check API's answer these tests read.
type checkAnswer struct {
	Outcome   string `json:"outcome"`
	Remaining int64  `json:"remaining"`
	Replayed  bool   `json:"replayed"`
	Cause     string `json:"cause"`
}
