package sluiceclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/openapitest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluiceclient"
	"github.com/sluicehq/sluice/subject"
)

// counted is a check API server on a loopback socket that counts the
// requests it is sent, by path, and the checks they hold; while held it
// keeps every request waiting until released. old makes it a server
// from before /v1/checks, which answers that path 404.
type counted struct {
	url     string
	mu      sync.Mutex
	paths   map[string]int
	checks  int           // checks received, one per /v1/check, len(checks) per /v1/checks
	arrived chan struct{} // one value per request received
	hold    chan struct{} // non-nil: requests wait until it is closed
}

const (
	appToken = "app-secret-0123456789" // scope check
	opsToken = "ops-secret-0123456789" // scopes check and refund
)

// startCounted runs the check API over store (memstore when nil), with
// the tokens appToken and opsToken, each exchange held to the OpenAPI
// document.
func startCounted(t *testing.T, store sluice.Store, old bool) *counted {
	t.Helper()
	if store == nil {
		ms, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		store = ms
	}
	lim, err := sluice.New(store, policies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []server.Token{
		{ID: "app", Secret: []byte(appToken), Scopes: []string{"check"}},
		{ID: "ops", Secret: []byte(opsToken), Scopes: []string{"check", "refund"}},
	}
	api, err := server.New(lim, subject.Unkeyed(), slog.New(slog.DiscardHandler), server.Options{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	cs := &counted{paths: map[string]int{}, arrived: make(chan struct{}, 1024)}
	validated := openapitest.Handler(t, api)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read body: %v", err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		n := 1
		if r.URL.Path == checkapi.ChecksPath {
			var b checkapi.Batch
			if err := json.Unmarshal(body, &b); err != nil {
				t.Errorf("POST /v1/checks %s: %v", body, err)
			}
			n = len(b.Checks)
		}
		cs.mu.Lock()
		cs.paths[r.URL.Path]++
		cs.checks += n
		hold := cs.hold
		cs.mu.Unlock()
		cs.arrived <- struct{}{}
		if hold != nil {
			<-hold
		}
		if old && r.URL.Path == checkapi.ChecksPath {
			http.NotFound(w, r)
			return
		}
		validated.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	cs.url = ts.URL
	return cs
}

// held makes requests wait until the function it returns is called
// (again: no effect), or the test ends.
func (cs *counted) held(t *testing.T) (release func()) {
	ch := make(chan struct{})
	cs.mu.Lock()
	cs.hold = ch
	cs.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			cs.mu.Lock()
			cs.hold = nil
			cs.mu.Unlock()
			close(ch)
		})
	}
	t.Cleanup(release) // before the server closes: cleanups run last first
	return release
}

// count returns the requests to path and the checks received so far.
func (cs *counted) count(path string) (requests, checks int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.paths[path], cs.checks
}

// onStores runs test on memstore and on a real redis-server.
func onStores(t *testing.T, test func(t *testing.T, store func(t *testing.T) sluice.Store)) {
	t.Run("memory", func(t *testing.T) { test(t, func(*testing.T) sluice.Store { return nil }) })
	t.Run("redis", func(t *testing.T) {
		test(t, func(t *testing.T) sluice.Store {
			c := redistest.Standalone(t).Client()
			t.Cleanup(func() { c.Close() })
			rs, err := redisstore.New(c, redisstore.Options{Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rs.Close() })
			return rs
		})
	})
}

// TestLoneCheckIsOneCheck: a caller alone is sent at once as a POST
// /v1/check, never as a batch.
func TestLoneCheckIsOneCheck(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) sluice.Store) {
		cs := startCounted(t, store(t), false)
		c := newClient(t, cs.url, sluiceclient.Options{Token: appToken})
		for i := range 3 {
			if o := c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "lone"}); o.Kind != sluice.Allowed {
				t.Fatalf("check %d = %v (%v), want allowed", i, o.Kind, o.Err)
			}
		}
		single, _ := cs.count(checkapi.CheckPath)
		batches, _ := cs.count(checkapi.ChecksPath)
		if single != 3 || batches != 0 {
			t.Errorf("3 checks one after another: %d POST /v1/check, %d POST /v1/checks; want 3 and 0", single, batches)
		}
	})
}

// mixed is the i-th request of the coalescing tests, on subjects ending
// in suffix: allowed, denied, of an unknown policy, of a cost above the
// limit, a refund the token has no scope for, a peek.
func mixed(i int, suffix string) sluice.Request {
	subj := fmt.Sprintf("s%d-%s", i, suffix)
	switch i % 6 {
	case 0:
		return sluice.Request{Policy: "demo", Subject: subj}
	case 1:
		return sluice.Request{Policy: "demo", Subject: "full"}
	case 2:
		return sluice.Request{Policy: "nope", Subject: subj}
	case 3:
		return sluice.Request{Policy: "demo", Subject: subj, Cost: 4}
	case 4:
		return sluice.Request{Op: sluice.Refund, Policy: "demo", Subject: subj}
	}
	return sluice.Request{Op: sluice.Peek, Policies: []string{"demo", "daily"}, Subject: subj}
}

// gather starts n callers of c, asking req(i) each, while cs holds every
// request, and waits until each is at the server or in c's queue; then
// releases them and returns their outcomes.
func gather(t *testing.T, cs *counted, c *sluiceclient.Client, n int, req func(i int) sluice.Request) []sluice.Outcome {
	t.Helper()
	_, before := cs.count("")
	release := cs.held(t)
	out := make([]sluice.Outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = c.Check(context.Background(), req(i)) })
	}
	waitFor(t, fmt.Sprintf("%d callers at the server or queued", n), func() bool {
		_, at := cs.count("")
		return at-before+sluiceclient.Queued(c) == n
	})
	release()
	wg.Wait()
	return out
}

// waitFor polls ok, a state of this process that other goroutines reach,
// for at most about 20s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for range 20000 {
		if ok() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

// TestConcurrentChecksCoalesce: 64 concurrent callers, mixed requests
// among them, are sent in a few requests, and each gets the outcome the
// same request gets alone (a twin of each, one at a time, on subjects of
// its own).
func TestConcurrentChecksCoalesce(t *testing.T) {
	onStores(t, func(t *testing.T, store func(t *testing.T) sluice.Store) {
		cs := startCounted(t, store(t), false)
		c := newClient(t, cs.url, sluiceclient.Options{Token: appToken})
		for range 3 {
			c.Check(t.Context(), sluice.Request{Policy: "demo", Subject: "full"})
		}
		before, _ := cs.count(checkapi.CheckPath)
		const n = checkapi.MaxChecks
		got := gather(t, cs, c, n, func(i int) sluice.Request { return mixed(i, "together") })
		single, _ := cs.count(checkapi.CheckPath)
		batches, _ := cs.count(checkapi.ChecksPath)
		requests := single - before + batches
		t.Logf("%d concurrent callers: %d requests (%d single, %d batches)", n, requests, single-before, batches)
		// One sent alone, one batch by the sender while it was on the
		// wire, the rest in one batch when they came back.
		if requests > 3 {
			t.Errorf("%d concurrent callers were sent in %d requests, want at most 3", n, requests)
		}
		one := newClient(t, cs.url, sluiceclient.Options{Token: appToken, NoCoalescing: true})
		for i := range n {
			want := one.Check(t.Context(), mixed(i, "alone"))
			if g, w := describe(got[i], want), describe(want, want); g != w {
				t.Errorf("request %d %+v:\ntogether %s\nalone    %s", i, mixed(i, ""), g, w)
			}
		}
	})
}

// describe prints o to compare it with like, another outcome of the same
// request on the same policies a moment apart: its durations are like's
// when within a few seconds (the real clock moved), its error is text.
func describe(o, like sluice.Outcome) string {
	near := func(a, b time.Duration) bool { return a-b < 5*time.Second && b-a < 5*time.Second }
	if near(o.ResetAfter, like.ResetAfter) && near(o.RetryAfter, like.RetryAfter) {
		o.ResetAfter, o.RetryAfter = like.ResetAfter, like.RetryAfter
	}
	for i := range min(len(o.Statuses), len(like.Statuses)) {
		s, l := &o.Statuses[i], &like.Statuses[i]
		if near(s.ResetAfter, l.ResetAfter) && near(s.RetryAfter, l.RetryAfter) {
			s.ResetAfter, s.RetryAfter = l.ResetAfter, l.RetryAfter
		}
	}
	err := ""
	if o.Err != nil {
		err = o.Err.Error()
	}
	o.Err = nil
	return fmt.Sprintf("%+v err %q", o, err)
}

// TestOlderServerGetsSingleChecks: a server that answers POST /v1/checks
// 404 gets each gathered check alone, and single checks from then on.
func TestOlderServerGetsSingleChecks(t *testing.T) {
	cs := startCounted(t, nil, true)
	c := newClient(t, cs.url, sluiceclient.Options{Token: appToken})
	for round := range 2 {
		out := gather(t, cs, c, 8, func(i int) sluice.Request {
			return sluice.Request{Policy: "daily", Subject: fmt.Sprintf("old-%d-%d", round, i)}
		})
		for i, o := range out {
			if o.Kind != sluice.Allowed || o.Remaining != 9 {
				t.Errorf("round %d, check %d = %v %+v (%v), want allowed with 9 remaining", round, i, o.Kind, o.Status, o.Err)
			}
		}
	}
	if batches, _ := cs.count(checkapi.ChecksPath); batches > 1 {
		t.Errorf("%d POST /v1/checks answered 404, want at most the first round's one (one sender)", batches)
	}
}

// TestCancelledCallerLeavesTheBatch: a caller whose context ends while
// its check is on the wire in a batch returns at once, Indeterminate;
// the others of the batch are answered, and its check was decided.
func TestCancelledCallerLeavesTheBatch(t *testing.T) {
	cs := startCounted(t, nil, false)
	c := newClient(t, cs.url, sluiceclient.Options{Token: appToken})
	release := cs.held(t)
	lone := make(chan sluice.Outcome, 1)
	go func() { lone <- c.Check(context.Background(), sluice.Request{Policy: "daily", Subject: "lone"}) }()
	<-cs.arrived
	ctx, cancel := context.WithCancel(context.Background())
	mine, other := make(chan sluice.Outcome, 1), make(chan sluice.Outcome, 1)
	// Queued while the lone one is on the wire, the cancelled caller's
	// check is taken by the sender; the other's arrives after it, and
	// waits in the queue while the sender's batch is held (or is at the
	// server, should a sender be free).
	go func() { mine <- c.Check(ctx, sluice.Request{Policy: "daily", Subject: "cancelled"}) }()
	waitFor(t, "the cancelled caller's check at the server", func() bool { _, n := cs.count(""); return n == 2 })
	go func() { other <- c.Check(context.Background(), sluice.Request{Policy: "daily", Subject: "other"}) }()
	waitFor(t, "the other check queued or at the server", func() bool {
		_, n := cs.count("")
		return n == 3 || sluiceclient.Queued(c) == 1
	})
	cancel()
	if o := <-mine; o.Kind != sluice.Indeterminate || !errors.Is(o.Err, context.Canceled) {
		t.Errorf("the cancelled caller = %v (%v), want indeterminate, context canceled", o.Kind, o.Err)
	}
	release()
	for name, ch := range map[string]chan sluice.Outcome{"lone": lone, "other": other} {
		if o := <-ch; o.Kind != sluice.Allowed || o.Remaining != 9 {
			t.Errorf("%s = %v %+v (%v), want allowed with 9 remaining", name, o.Kind, o.Status, o.Err)
		}
	}
	o := c.Check(t.Context(), sluice.Request{Op: sluice.Peek, Policy: "daily", Subject: "cancelled"})
	if o.Remaining != 9 {
		t.Errorf("the cancelled caller's check: %d remaining after it, want 9: it was sent and decided", o.Remaining)
	}
}
