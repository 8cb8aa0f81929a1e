package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCheckLeaseCommands: --renew extends the lease a check answered
// (POST /v1/renew) and answers it again; --release and --renew together
// are a usage error; a URL where something else than the check API
// answers is named, and its page is not printed as an answer.
func TestCheckLeaseCommands(t *testing.T) {
	s := startServe(t, "--config", writeConfig(t, demoConfig))
	check := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := exitCode(run(context.Background(), append([]string{"check"}, args...), &out, &errOut), &errOut)
		return code, out.String(), errOut.String()
	}
	reports := []string{"--url", s.url, "--policy", "reports", "--subject", "dora"}
	code, answer, _ := check(reports...)
	var held struct {
		LeaseID string `json:"lease_id"`
	}
	if err := json.Unmarshal([]byte(answer), &held); code != 0 || err != nil || held.LeaseID == "" {
		t.Fatalf("check of a concurrency policy = %d %q, want 0 with a lease_id", code, answer)
	}
	if code, out, _ := check(append(reports, "--renew", held.LeaseID)...); code != 0 || !strings.Contains(out, `"lease_id":"`+held.LeaseID+`"`) || !strings.Contains(out, `"remaining":0`) {
		t.Errorf("check --renew = %d %q, want 0 naming the lease, still held (remaining 0)", code, out)
	}
	if code, _, errOut := check(append(reports, "--renew", held.LeaseID, "--release", held.LeaseID)...); code != 2 || !strings.Contains(errOut, "--release or --renew, not both") {
		t.Errorf("check --renew --release = %d %q, want 2 saying not both", code, errOut)
	}
	if code, out, _ := check(append(reports, "--release", held.LeaseID)...); code != 0 || !strings.Contains(out, `"remaining":1`) {
		t.Errorf("check --release after --renew = %d %q, want 0 with the slot free", code, out)
	}
	if code, _, errOut := check(append(reports, "--evaluation-id", "e1", "--renew", held.LeaseID)...); code != 2 || !strings.Contains(errOut, "400 Bad Request: incompatible: a release or renewal takes policy (or policies), subject and lease_id only") {
		t.Errorf("check --renew with an evaluation id = %d %q, want 2 with the server's reason", code, errOut)
	}
	page := httptest.NewServer(http.NotFoundHandler())
	defer page.Close()
	if code, out, errOut := check("--url", page.URL, "--policy", "demo", "--subject", "dora"); code != 2 || out != "" || !strings.Contains(errOut, "404 Not Found from "+page.URL+"/v1/check: checkapi: not a check API answer") {
		t.Errorf("check against a plain 404 page = %d, stdout %q, stderr %q; want 2 naming the URL, nothing printed", code, out, errOut)
	}
}

// TestCheckEstimateSettle: --op estimate spends --cost as an estimate
// under --evaluation-id, --op settle replaces it with the actual --cost
// (the difference given back), and a settle sent again is replayed and
// changes nothing.
func TestCheckEstimateSettle(t *testing.T) {
	s := startServe(t, "--config", writeConfig(t, demoConfig))
	check := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		base := []string{"check", "--url", s.url, "--policy", "demo", "--subject", "erin", "--evaluation-id", "job-1"}
		code := exitCode(run(context.Background(), append(base, args...), &out, &errOut), &errOut)
		return code, out.String(), errOut.String()
	}
	if code, out, errOut := check("--op", "estimate", "--cost", "3"); code != 0 || !strings.Contains(out, `"remaining":0`) {
		t.Fatalf("check --op estimate --cost 3 = %d %q %q, want 0 with remaining 0", code, out, errOut)
	}
	for _, want := range []string{`"replayed":false`, `"replayed":true`} {
		if code, out, errOut := check("--op", "settle", "--cost", "1"); code != 0 || !strings.Contains(out, `"remaining":2`) || !strings.Contains(out, want) {
			t.Errorf("check --op settle --cost 1 = %d %q %q, want 0 with remaining 2 and %s", code, out, errOut, want)
		}
	}
	if code, _, errOut := check("--op", "borrow"); code != 2 || !strings.Contains(errOut, "borrow") {
		t.Errorf("check --op borrow = %d %q, want 2 naming the op", code, errOut)
	}
}

// TestCheckBook: --op book on a gcra policy of one an hour (whose
// operator lets a booking wait 2h) is admitted at once, then booked the
// slot an hour ahead (delay_ms), and with --max-wait 1m refused (exit 1);
// a --max-wait of a fraction of a millisecond is a usage error.
func TestCheckBook(t *testing.T) {
	s := startServe(t, "--config", writeConfig(t, demoConfig+`  - id: hourly
    algorithm: gcra
    limit: 1
    window: 1h
    max_wait: 2h
`))
	check := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		base := []string{"check", "--url", s.url, "--policy", "hourly", "--subject", "w", "--op", "book"}
		code := exitCode(run(context.Background(), append(base, args...), &out, &errOut), &errOut)
		return code, out.String(), errOut.String()
	}
	if code, out, errOut := check(); code != 0 || strings.Contains(out, "delay_ms") {
		t.Fatalf("first book = %d %q %q, want 0, admitted now", code, out, errOut)
	}
	if code, out, errOut := check("--max-wait", "2h"); code != 0 || !strings.Contains(out, `"delay_ms":`) {
		t.Fatalf("second book = %d %q %q, want 0 with a delay_ms", code, out, errOut)
	}
	if code, out, errOut := check("--max-wait", "1m"); code != 1 {
		t.Fatalf("book with --max-wait 1m = %d %q %q, want 1 (denied)", code, out, errOut)
	}
	if code, _, errOut := check("--max-wait", "1500us"); code != 2 || !strings.Contains(errOut, "whole number of milliseconds") {
		t.Errorf("--max-wait 1500us = %d %q, want a usage error", code, errOut)
	}
}
