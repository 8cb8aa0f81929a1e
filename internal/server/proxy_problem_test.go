package server_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
)

// TestProxyProblemDatesAMonthlyWait: the proxy's 429 for a monthly quota
// says when to come back as an RFC 3339 date in UTC, not as millions of
// seconds; Retry-After stays in seconds. The date is on the proxy's clock
// (the real one; the store's is fake), so it is bounded by the instants
// before and after the request.
func TestProxyProblemDatesAMonthlyWait(t *testing.T) {
	up := newUpstream(t)
	policies := []sluice.Policy{{ID: "monthly", Algorithm: sluice.FixedWindow, Limit: 1, Period: "month"}}
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/"}, Policies: []string{"monthly"}, Subject: "ip"},
	}}, nil, policies)
	f.clock.Set(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	if resp := f.send(t, "GET", "/", ""); resp.StatusCode != 201 {
		t.Fatalf("first request: %d, want the upstream's 201", resp.StatusCode)
	}
	before := time.Now()
	resp := f.send(t, "GET", "/", "")
	after := time.Now()
	const wait = (21*24 + 12) * time.Hour // to 1 April, 00:00 UTC
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != strconv.Itoa(int(wait/time.Second)) {
		t.Fatalf("second request: %d Retry-After %q, want 429 and %d", resp.StatusCode, resp.Header.Get("Retry-After"), wait/time.Second)
	}
	var p struct {
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(resp.body), &p); err != nil {
		t.Fatalf("problem %q: %v", resp.body, err)
	}
	date, _ := strings.CutPrefix(p.Detail, "Too many requests; retry after ")
	date, _ = strings.CutSuffix(date, ".")
	at, err := time.Parse(time.RFC3339, date)
	if err != nil || !strings.HasSuffix(date, "Z") {
		t.Fatalf("detail = %q, want %q with an RFC 3339 date in UTC (%v)", p.Detail, "Too many requests; retry after <date>.", err)
	}
	if lo, hi := before.Add(wait).Truncate(time.Second), after.Add(wait+time.Second); at.Before(lo) || at.After(hi) {
		t.Errorf("detail = %q: want a date between %v and %v (now + Retry-After)", p.Detail, lo.UTC(), hi.UTC())
	}
}
