package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// batchEntry returns the i-th check of TestChecksAnswersEachInOrder's
// batch, its subjects ending in suffix, and the status /v1/check answers
// it: eight kinds in turn.
func batchEntry(i int, suffix string) (string, int) {
	subj := fmt.Sprintf("s%d-%s", i, suffix)
	switch i % 8 {
	case 0:
		return fmt.Sprintf(`{"policy":"fw","subject":%q}`, subj), http.StatusOK
	case 1:
		return `{"policy":"fw","subject":"full","cost":1}`, http.StatusTooManyRequests
	case 2:
		return fmt.Sprintf(`{"policy":"nope","subject":%q}`, subj), http.StatusNotFound
	case 3:
		return fmt.Sprintf(`{"policy":"fw","subject":%q,"cost":11}`, subj), http.StatusUnprocessableEntity
	case 4:
		return fmt.Sprintf(`{"policy":"fw","subject":%q,"cost":1,"refund":true}`, subj), http.StatusForbidden
	case 5:
		return fmt.Sprintf(`{"policy":"fw","subjekt":%q}`, subj), http.StatusBadRequest
	case 6:
		return fmt.Sprintf(`{"policies":["fw","gc"],"subject":%q,"cost":2,"evaluation_id":"e%d"}`, subj, i), http.StatusOK
	}
	return fmt.Sprintf(`{"policy":"fw","subject":%q,"cost":-1}`, subj), http.StatusBadRequest
}

// TestChecksAnswersEachInOrder: a batch of 64 checks, allowed, denied,
// of an unknown policy, of a cost above the limit, a refund the token has
// no scope for, malformed ones, is answered 200 with one result per check
// in order, each the answer and status /v1/check gives the same check
// alone (a twin of each, on subjects of its own, sent one by one).
func TestChecksAnswersEachInOrder(t *testing.T) {
	onBothStores(t, func(t *testing.T, h *hostile) {
		for range 10 {
			if code, a := h.post(t, checkapi.CheckPath, abuseCheck, `{"policy":"fw","subject":"full"}`); code != 200 {
				t.Fatalf("filling fw for full: %d %+v", code, a)
			}
		}
		entries := make([]string, checkapi.MaxChecks)
		for i := range entries {
			entries[i], _ = batchEntry(i, "batch")
		}
		sent := time.Now()
		code, raw := call(t, "POST", h.url+checkapi.ChecksPath, abuseCheck, `{"checks":[`+strings.Join(entries, ",")+`]}`)
		if code != 200 {
			t.Fatalf("POST /v1/checks = %d %s, want 200", code, raw)
		}
		got, err := checkapi.ParseBatchAnswer([]byte(raw), len(entries))
		if err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		for i := range entries {
			single, want := batchEntry(i, "single")
			scode, sa := h.post(t, checkapi.CheckPath, abuseCheck, single)
			r := got.Results[i]
			if r.Status != want || scode != want {
				t.Errorf("check %d %s: status %d in the batch, %d alone, want %d (%+v)", i, entries[i], r.Status, scode, want, r.Answer)
				continue
			}
			if h.clock == nil {
				// Redis's own clock moved between the two, by no more than
				// the time since the batch was sent: the window's end is
				// that much nearer for the twin.
				sameWindow(t, i, &r.Answer, &sa, time.Since(sent).Milliseconds()+1)
			}
			if a, b := answerJSON(t, r.Answer), answerJSON(t, sa); a != b {
				t.Errorf("check %d %s: answered %s in the batch, %s alone", i, entries[i], a, b)
			}
		}
	})
}

// sameWindow copies b's durations into a when they are within slack ms
// (the time that passed between the two decisions at most).
func sameWindow(t *testing.T, i int, a, b *checkapi.Answer, slack int64) {
	t.Helper()
	near := func(x, y int64) bool { return x-y <= slack && y-x <= slack }
	if !near(a.ResetAfterMS, b.ResetAfterMS) || !near(a.RetryAfterMS, b.RetryAfterMS) {
		t.Errorf("check %d: reset %d, retry %d in the batch; %d, %d alone", i, a.ResetAfterMS, a.RetryAfterMS, b.ResetAfterMS, b.RetryAfterMS)
	}
	a.ResetAfterMS, a.RetryAfterMS = b.ResetAfterMS, b.RetryAfterMS
	for j := range min(len(a.Statuses), len(b.Statuses)) {
		a.Statuses[j].ResetAfterMS, a.Statuses[j].RetryAfterMS = b.Statuses[j].ResetAfterMS, b.Statuses[j].RetryAfterMS
	}
}

func answerJSON(t *testing.T, a checkapi.Answer) string {
	t.Helper()
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestChecksRefusedWhole: the whole request is refused only when its
// body is not a list of 1 to 64 checks within the bound, or its token is
// not valid.
func TestChecksRefusedWhole(t *testing.T) {
	onBothStores(t, func(t *testing.T, h *hostile) {
		one := `{"policy":"fw","subject":"x"}`
		for _, tc := range []struct {
			name, token, body string
			code              int
			reason            string
		}{
			{"no token", "", `{"checks":[` + one + `]}`, 401, "bearer token"},
			{"empty body", abuseCheck, ``, 400, "request body is empty"},
			{"not JSON", abuseCheck, `{"checks":[`, 400, "malformed JSON"},
			{"not a list", abuseCheck, `{"checks":{}}`, 400, "malformed JSON"},
			{"unknown field", abuseCheck, `{"checks":[` + one + `],"check":1}`, 400, `unknown field "check"`},
			{"no checks", abuseCheck, `{"checks":[]}`, 400, "checks is empty"},
			{"65 checks", abuseCheck, `{"checks":[` + strings.Repeat(one+",", 64) + one + `]}`, 413, "checks holds 65 checks: must be at most 64"},
			{"over the bound", abuseCheck, `{"checks":[{"policy":"fw","subject":"` + strings.Repeat("x", 300<<10) + `"}]}`, 413, "larger than 262144 bytes"},
		} {
			code, raw := call(t, "POST", h.url+checkapi.ChecksPath, tc.token, tc.body)
			a, err := checkapi.ParseAnswer([]byte(raw))
			if code != tc.code || err != nil || a.Outcome != "incompatible" || !strings.Contains(a.Reason, tc.reason) {
				t.Errorf("%s: %d %.200s (%v), want %d naming %q", tc.name, code, raw, err, tc.code, tc.reason)
			}
		}
		if left := h.left(t, "fw", "x"); left != 10 {
			t.Errorf("fw has %d left for x after refused batches, want 10: nothing spent", left)
		}
	})
}

// gateStore holds every decision until n have arrived, then lets them all
// go to the store at once: a server that decided a batch's checks one
// after another would never open it.
type gateStore struct {
	sluice.Store
	pass    atomic.Int32 // decisions to let through first, ungated
	arrived chan struct{}
	open    chan struct{}
}

func (g *gateStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	if g.pass.Add(-1) >= 0 {
		return g.Store.Evaluate(ctx, ev)
	}
	g.arrived <- struct{}{}
	<-g.open
	return g.Store.Evaluate(ctx, ev)
}

// TestChecksShareRoundTrips: the 16 checks of one batch reach the store
// together (the gate opens only when all are in), and redisstore, which
// sends the decisions it finds waiting together, decides them in far
// fewer script calls than 16: counted by Redis (INFO commandstats).
func TestChecksShareRoundTrips(t *testing.T) {
	srv := redistest.Standalone(t)
	rc := srv.Client()
	t.Cleanup(func() { rc.Close() })
	rs, err := redisstore.New(rc, redisstore.Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	const n = 16
	gate := &gateStore{Store: rs, arrived: make(chan struct{}, n), open: make(chan struct{})}
	gate.pass.Store(1)
	f := newFixtureOn(t, &recordingStore{Store: gate}, sluicetest.NewClock(), demoPolicies, server.Options{Store: server.StoreInfo{Type: "redis", Batches: true}})
	// One decision first, ungated, so the script is loaded before the
	// count starts.
	if resp, a := f.post(t, `{"policy":"api","subject":"warm"}`); resp.StatusCode != 200 {
		t.Fatalf("warm-up check: %d %+v", resp.StatusCode, a)
	}
	before := scriptCalls(t, srv)
	entries := make([]string, n)
	for i := range entries {
		entries[i] = fmt.Sprintf(`{"policy":"api","subject":"s%d"}`, i)
	}
	done := make(chan string, 1)
	go func() {
		resp, err := http.Post(f.url+checkapi.ChecksPath, "application/json", strings.NewReader(`{"checks":[`+strings.Join(entries, ",")+`]}`))
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		var a checkapi.BatchAnswer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != 200 || len(a.Results) != n {
			done <- fmt.Sprintf("%d, %d results (%v)", resp.StatusCode, len(a.Results), err)
			return
		}
		for i, r := range a.Results {
			if r.Status != 200 {
				done <- fmt.Sprintf("check %d: %d %+v", i, r.Status, r.Answer)
				return
			}
		}
		done <- ""
	}()
	for i := range n {
		select {
		case <-gate.arrived:
		case msg := <-done:
			t.Fatalf("POST /v1/checks of %d answered with %d checks at the store: %s", n, i, msg)
		}
	}
	close(gate.open)
	if msg := <-done; msg != "" {
		t.Fatalf("POST /v1/checks of %d: %s", n, msg)
	}
	calls := scriptCalls(t, srv) - before
	t.Logf("%d checks in one batch: %d script calls", n, calls)
	if calls > n/2 {
		t.Errorf("%d checks in one batch cost %d script calls, want at most %d: redisstore sends decisions waiting together in one call", n, calls, n/2)
	}
}

// scriptCalls returns how many FCALL and EVALSHA commands srv has run.
func scriptCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	c := srv.Client()
	defer c.Close()
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for line := range strings.SplitSeq(info, "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "cmdstat_fcall" && name != "cmdstat_evalsha") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.Atoi(calls)
		if err != nil {
			t.Fatalf("INFO commandstats: %q: %v", line, err)
		}
		total += n
	}
	return total
}

// TestChecksDecidedInOrderInProcess: on a store that decides in process
// (memstore), the checks of a batch are decided one after another in
// the order written, on the request's own goroutine: eight checks of one
// subject on a policy of three admit the first three and deny the rest.
// (Decided at once, a goroutine each, they came to the store in any
// order, each at the cost of its goroutine's start and stack growth.)
func TestChecksDecidedInOrderInProcess(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	entries := make([]string, 8)
	for i := range entries {
		entries[i] = `{"policy":"demo","subject":"alice"}`
	}
	code, raw := call(t, "POST", f.url+checkapi.ChecksPath, "", `{"checks":[`+strings.Join(entries, ",")+`]}`)
	if code != 200 {
		t.Fatalf("POST /v1/checks = %d %s, want 200", code, raw)
	}
	a, err := checkapi.ParseBatchAnswer([]byte(raw), len(entries))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]int, len(a.Results))
	for i, r := range a.Results {
		got[i] = r.Status
	}
	if want := []int{200, 200, 200, 429, 429, 429, 429, 429}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("statuses %v, want %v: the checks decided in the order written", got, want)
	}
}

// TestChecksEntriesOfAnyValue: an entry that is JSON but not a check's
// body (a number, an array of checks, a string, an object of a wrong
// type or unknown field) is its own 400 with encoding/json's reason, and
// the entries after it are decided as if it were not there; null is the
// empty check (its 400 names the missing subject).
func TestChecksEntriesOfAnyValue(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{})
	entries := []string{`5`, `[{"policy":"demo","subject":"a"}]`, `{"policy":"demo","subject":"a"}`, `"x"`, `{"policy":["demo"],"subject":"b"}`, `null`, `{"policy":"demo","subject":"a","x":{"y":[1]}}`, `{"policy":"demo","subject":"a"}`}
	code, raw := call(t, "POST", f.url+checkapi.ChecksPath, "", `{"checks":[`+strings.Join(entries, " ,\n")+`]}`)
	if code != 200 {
		t.Fatalf("POST /v1/checks = %d %s, want 200", code, raw)
	}
	a, err := checkapi.ParseBatchAnswer([]byte(raw), len(entries))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		status int
		reason string
	}{
		{400, "malformed JSON: cannot unmarshal number into Go value of type checkapi.Request"},
		{400, "malformed JSON: cannot unmarshal array into Go value of type checkapi.Request"},
		{200, ""},
		{400, "malformed JSON: cannot unmarshal string into Go value of type checkapi.Request"},
		{400, "malformed JSON: cannot unmarshal array into Go struct field Request.policy of type string"},
		{400, ""},
		{400, `malformed JSON: unknown field "x"`},
		{200, ""},
	}
	for i, r := range a.Results {
		if r.Status != want[i].status || want[i].reason != "" && r.Reason != want[i].reason {
			t.Errorf("entry %d %s: %d %q, want %d %q", i, entries[i], r.Status, r.Reason, want[i].status, want[i].reason)
		}
	}
}
