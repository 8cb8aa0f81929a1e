package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// chromiumHint says how to get the browser the dashboard test drives.
const chromiumHint = "make deps (apt-get install chromium)"

// TestDashboardInBrowser opens the dashboard of a running sluice serve in
// a real headless Chromium: the policies render (an Envoy rule's marked
// shadow, its week a fixed 7 days), the decision counts move
// after traffic reaches /v1/check, the playground draws a chart, and the
// page asks nothing of any other origin. Like the Redis tests, it fails
// when the binary it needs is missing: make test installs it.
func TestDashboardInBrowser(t *testing.T) {
	redistest.Long(t)
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed; install it with: %s", chromiumHint)
	}
	cfg := writeConfig(t, `
server:
  listen: "127.0.0.1:0"
policies:
  - { id: login, algorithm: sliding_log, limit: 5, window: 1h }
  - { id: api, algorithm: gcra, limit: 100, window: 1s, burst: 20, priorities: { critical: 100%, sheddable: 50% } }
  - { id: paced, algorithm: gcra, limit: 1, window: 1h, max_wait: 2h }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules.yaml"]
  rlqs:
    domains:
      - domain: edge
        buckets:
          - { match: { tenant: "*" }, policy: paced }
`)
	// An Envoy rule in shadow mode, a week long: the page marks it so.
	if err := os.WriteFile(filepath.Join(filepath.Dir(cfg), "rules.yaml"), []byte(`domain: shop
descriptors:
  - key: tenant
    shadow_mode: true
    rate_limit: { unit: week, requests_per_unit: 1000 }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "-c", cfg)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
		chromedp.Flag("disable-gpu", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to sandbox as root
	}
	// A bound for a browser that hangs, not a performance threshold.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	var mu sync.Mutex
	var requested []string
	if err := chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			requested = append(requested, e.Request.URL)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("chromedp: %v", err)
	}

	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	waitFor := func(what, predicate string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](predicate, chromedp.WithPollingTimeout(90*time.Second))); err != nil {
			t.Fatalf("waiting until %s (%s): %v", what, predicate, err)
		}
	}
	cell := func(policy, class string) string {
		return `document.querySelector('#policies tr[data-policy="` + policy + `"] td.` + class + `').textContent`
	}

	// The policies render with their numbers.
	do("open /ui", chromedp.Navigate(s.url+"/ui"), chromedp.WaitVisible(chromedp.CSS(`#policies tr[data-policy="api"]`)))
	if got := eval(`Array.from(document.querySelectorAll('#policies tbody tr')).map(r => Array.from(r.cells).slice(0, 5).map(c => c.textContent).join(' ')).join('; ')`); got != "login sliding_log 5 1h0m0s ; api gcra · critical 100%, sheddable 50% 100 1s 20; paced gcra 1 1h0m0s 1; shop.tenant shadow fixed_window 1000 week (7 days, fixed) " {
		t.Errorf("policies table = %q, want login, api and paced with their numbers (api's priority classes beside its algorithm)", got)
	}
	if got := eval(`Array.from(document.querySelector('#policies tr[data-policy="shop.tenant"]').cells).slice(0, 4).map(c => c.textContent).join(' | ')`); got != "shop.tenant shadow | fixed_window | 1000 | week (7 days, fixed)" {
		t.Errorf("Envoy rule's row = %q, want it marked shadow, its week a fixed 7 days", got)
	}
	if got := eval(cell("shop.tenant", "denied")); got != "0 (answered OK)" {
		t.Errorf("shadow rule's denied = %q, want 0 (answered OK)", got)
	}
	if got := eval(cell("login", "allowed")); got != "0" {
		t.Errorf("login allowed before traffic = %q, want 0", got)
	}
	if got := eval(`document.querySelector('#store').textContent`); !strings.Contains(got, "reachable") || !strings.Contains(got, "memory") {
		t.Errorf("store health = %q, want the memory store reachable", got)
	}

	// Traffic moves the counts: 5 allowed and 2 denied for login.
	for range 7 {
		resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"login","subject":"alice@example.com"}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	waitFor("the login counts move", cell("login", "allowed")+` === "5" && `+cell("login", "denied")+` === "2"`)
	if n := eval(`String(document.querySelectorAll('#live .live-policy[data-policy="login"] polyline').length)`); n != "2" {
		t.Errorf("live chart of login has %s lines, want 2 (allowed, denied)", n)
	}

	// Settles fill the Settles table: on login (5 an hour, another
	// subject), an estimate of 3 settled at 1 gives 2 back; one of 2
	// settled at 6 charges 4, 2 past the limit.
	if got := eval(`document.querySelector('#settles tbody').textContent`); got != "none yet" {
		t.Errorf("settles before any = %q, want none yet", got)
	}
	// checkAll posts each body to /v1/check, wanting 200.
	checkAll := func(bodies ...string) {
		t.Helper()
		for _, body := range bodies {
			resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("POST /v1/check %s = %d, want 200", body, resp.StatusCode)
			}
		}
	}
	checkAll(
		`{"policy":"login","subject":"bob","op":"estimate","cost":3,"evaluation_id":"e1"}`,
		`{"policy":"login","subject":"bob","op":"settle","cost":1,"evaluation_id":"e1"}`,
		`{"policy":"login","subject":"bob","op":"estimate","cost":2,"evaluation_id":"e2"}`,
		`{"policy":"login","subject":"bob","op":"settle","cost":6,"evaluation_id":"e2"}`,
	)
	settled := func(class string) string {
		return `document.querySelector('#settles tr[data-policy="login"] td.` + class + `')?.textContent`
	}
	waitFor("the Settles table shows login's settles", settled("charged")+` === "4" && `+settled("given-back")+` === "2" && `+settled("owed")+` === "2"`)

	// The Priorities table lists api's classes with their shares, and
	// counts a sheddable check; op book on paced (1 an hour) waits on its
	// second booking, which the Waits booked table counts. No proxy runs:
	// the Queues table says none yet.
	if got := eval(`Array.from(document.querySelectorAll('#priorities tbody tr')).map(r => r.cells[1].textContent + ' ' + r.cells[2].textContent).join(', ')`); got != "critical 100%, default 100%, sheddable 50%" {
		t.Errorf("priorities table = %q, want api's classes critical, default and sheddable with their shares", got)
	}
	if got := eval(`document.querySelector('#queues tbody').textContent + ' / ' + document.querySelector('#bookings tbody').textContent`); got != "none yet / none yet" {
		t.Errorf("queues / bookings before any = %q, want none yet / none yet", got)
	}
	checkAll(
		`{"policy":"api","subject":"carol","priority":"sheddable"}`,
		`{"policy":"paced","subject":"dave","op":"book"}`,
		`{"policy":"paced","subject":"dave","op":"book"}`,
	)
	waitFor("the Priorities table counts the sheddable check",
		`document.querySelector('#priorities tr[data-policy="api"][data-class="sheddable"] td.allowed')?.textContent === "1"`)
	waitFor("the Waits booked table counts paced's wait",
		`document.querySelector('#bookings tr[data-policy="paced"] td.waits')?.textContent === "1"`)
	if got := eval(`document.querySelector('#bookings tr[data-policy="paced"] td.mean-delay').textContent`); got != "60.0 min" && got != "1.00 h" {
		t.Errorf("paced's mean delay = %q, want 60.0 min (a slot just under an hour ahead; 1.00 h were it booked in the same µs)", got)
	}

	// The playground runs the simulator and draws its chart.
	do("run the playground", chromedp.Click(chromedp.CSS(`#sim-form button`)))
	waitFor("the playground draws a chart", `document.querySelectorAll('#sim-chart svg g.lane').length === 5`)
	if got := eval(`document.querySelector('#sim-results tr[data-algorithm="fixed_window"]').cells[3].textContent`); got != "19" {
		t.Errorf("playground: fixed_window most in one window = %q, want 19 on the boundary pattern", got)
	}
	if got := eval(`document.querySelector('#sim-error').hidden ? '' : document.querySelector('#sim-error').textContent`); got != "" {
		t.Errorf("playground error %q", got)
	}

	// An Envoy proxy reports a bucket of the quota service: the Envoy
	// quota buckets table lists it by its subject, one stream.
	m := envoyListening.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no envoy listening line:\n%s", s.logs)
	}
	p, err := envoyrlqs.Dial(m[1], envoyrlqs.Options{Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Admit(map[string]string{"tenant": "alice-tenant"})
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("the quota bucket is listed", `document.querySelector('#rlqs tr[data-domain="edge"] td.streams')?.textContent === "1" && `+
		`document.querySelector('#rlqs tr[data-domain="edge"] td.allowed')?.textContent === "1"`)

	// Nothing on the page names the subject.
	if body := eval(`document.body.innerText`); strings.Contains(body, "alice") {
		t.Errorf("the dashboard shows the subject:\n%s", body)
	}

	// docs/observability.md's screenshot is this page: quality 100 makes a PNG. It
	// goes to a temporary file, and to docs/dashboard.png when
	// SLUICE_SCREENSHOT=docs asks (make screenshot), which keeps the
	// page's picture the page as it is.
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if !bytes.HasPrefix(shot, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot is not a PNG: starts %q", shot[:min(8, len(shot))])
	}
	path := filepath.Join(t.TempDir(), "dashboard.png")
	if os.Getenv("SLUICE_SCREENSHOT") == "docs" {
		path = filepath.Join("..", "..", "docs", "dashboard.png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)

	// Every request the page made went to the server it came from.
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]bool{}
	for _, u := range requested {
		switch {
		case strings.HasPrefix(u, s.url+"/"):
			seen[strings.TrimPrefix(u, s.url)] = true
		case strings.HasPrefix(u, "data:"):
		default:
			t.Errorf("the page requested %s, outside the server %s", u, s.url)
		}
	}
	for _, want := range []string{"/ui", "/ui/app.js", "/ui/app.css", "/ui/api/state", "/ui/api/simulate"} {
		if !seen[want] {
			t.Errorf("no request for %s seen among %v: is the network listener working?", want, requested)
		}
	}
}
