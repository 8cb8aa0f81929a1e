package server_test

// The abuse suite: each row of docs/security.md's caller table ("Operations
// and their callers") is played by a hostile caller against server.Run on
// real sockets, on memstore and on a real redis-server, and its bound
// asserted. TestAbuseTableCovered holds the table and the suite together:
// a row names its tests, and every TestAbuse* function has a row.

import (
	"cmp"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/sluicetest"
)

// callerTable is the page and the section that hold the caller table.
const (
	callerTablePage    = "../../docs/security.md"
	callerTableSection = "## Operations and their callers"
)

// abuseTestName is how a test of the suite is named, in the table and in
// the code.
var abuseTestName = regexp.MustCompile(`\bTestAbuse[A-Za-z0-9_]*`)

// callerRows reads the caller table: each row's operation (the first
// column, without its backticks) and the tests its last column names.
func callerRows(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(callerTablePage)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n"+callerTableSection+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", callerTablePage, callerTableSection)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string][]string{}
	header := true
	for line := range strings.SplitSeq(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 {
				break // the table ended: one table per section
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if header || strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
			header = false
			continue
		}
		op := strings.Trim(strings.TrimSpace(cells[0]), "`")
		if _, dup := rows[op]; dup {
			t.Errorf("%s: the caller table has two rows for %q", callerTablePage, op)
		}
		rows[op] = abuseTestName.FindAllString(cells[len(cells)-1], -1)
	}
	return rows
}

// abuseFuncs returns the TestAbuse* functions of this package's test
// files, each with the file that declares it.
func abuseFuncs(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	funcs := map[string]string{}
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && abuseTestName.MatchString(fn.Name.Name) && abuseTestName.FindString(fn.Name.Name) == fn.Name.Name {
				funcs[fn.Name.Name] = name
			}
		}
	}
	return funcs
}

// rlqsOps are the operations of Envoy's quota service, each a row: a
// plan for a bucket (the admin API's override, rlqs form), the list of
// buckets (GET /v1/rlqs), and the stream (StreamRateLimitQuotas).
var rlqsOps = []string{"override rlqs", "rlqs list", "rlqs stream"}

// tableFrame is the test that checks the table itself: no row of its own.
const tableFrame = "TestAbuseTableCovered"

// TestAbuseTableCovered fails when the caller table in docs/security.md
// and the abuse suite drift apart: a row for every operation a Limiter
// takes (and for override, the admin API's; and Envoy's quota service's
// rlqsOps), at least one test per row,
// every test a row names declared in this package, every TestAbuse*
// function named by a row.
func TestAbuseTableCovered(t *testing.T) {
	rows := callerRows(t)
	funcs := abuseFuncs(t)
	ops := append([]string{"override"}, rlqsOps...)
	for op := sluice.Spend; !strings.HasPrefix(op.String(), "Op("); op++ {
		if op.String() != "hold" { // local quota's block, inside a Limiter: no caller asks for it
			ops = append(ops, op.String())
		}
	}
	named := map[string]bool{}
	for _, op := range ops {
		tests, ok := rows[op]
		switch {
		case !ok:
			t.Errorf("%s: the caller table has no row for %s", callerTablePage, op)
		case len(tests) == 0:
			t.Errorf("%s: the row of %s names no TestAbuse test", callerTablePage, op)
		}
		for _, name := range tests {
			named[name] = true
			if _, ok := funcs[name]; !ok {
				t.Errorf("%s: the row of %s names %s, which no test file of internal/server declares", callerTablePage, op, name)
			}
		}
	}
	for op := range rows {
		if !slices.Contains(ops, op) {
			t.Errorf("%s: the caller table has a row for %q, which is no operation: want one of %s", callerTablePage, op, strings.Join(ops, ", "))
		}
	}
	for name, file := range funcs {
		if !named[name] && name != tableFrame {
			t.Errorf("%s (%s) has no row in %s's caller table: add the row with the test", name, file, callerTablePage)
		}
	}
}

// The abuse suite's tokens: a client of the check scope only, one that
// may also give units back, and one that may only reset.
const (
	abuseCheck  = "abuse-check-0123456789abcdef"
	abuseRefund = "abuse-refund-0123456789abcdef"
	abuseReset  = "abuse-reset-0123456789abcdef"
)

var hostileEnv = map[string]string{
	"ABUSE_CHECK": abuseCheck, "ABUSE_REFUND": abuseRefund, "ABUSE_RESET": abuseReset,
	"ABUSE_HMAC": "abuse-hmac-0123456789abcdef0123456789",
}

// abuseConfig is the suite's server: its tokens, an HMAC key, the store
// (%s) and a policy of each algorithm, 10 an hour (concurrency: 2 leases
// for an hour, and short: 1 lease for 2s, to be outlived).
const abuseConfig = `server:
  listen: 127.0.0.1:0
  auth:
    tokens:
      - { id: app, secret_env: ABUSE_CHECK, scopes: [check] }
      - { id: ops, secret_env: ABUSE_REFUND, scopes: [check, refund] }
      - { id: unlock, secret_env: ABUSE_RESET, scopes: [reset] }
subjects:
  hmac_keys:
    - { id: k1, secret_env: ABUSE_HMAC }
%s
policies:
  - { id: fw, algorithm: fixed_window, limit: 10, window: 1h }
  - { id: cal, algorithm: fixed_window, limit: 10, period: year }
  - { id: sl, algorithm: sliding_log, limit: 10, window: 1h }
  - { id: sw, algorithm: sliding_window, limit: 10, window: 1h }
  - { id: tb, algorithm: token_bucket, limit: 10, window: 1h }
  - { id: gc, algorithm: gcra, limit: 10, window: 1h }
  - { id: conc, algorithm: concurrency, limit: 2, lease_ttl: 1h }
  - { id: short, algorithm: concurrency, limit: 1, lease_ttl: 2s }
`

// rateIDs are the abuse config's rate policies, each 10 an hour.
var rateIDs = []string{"fw", "cal", "sl", "sw", "tb", "gc"}

// hostile is the abuse suite's server under attack.
type hostile struct {
	url   string
	clock *sluicetest.Clock // memstore's; nil on Redis, which keeps its own time
	redis *redistest.Server // nil on memstore
}

// onBothStores runs play against a server of abuseConfig on memstore
// (with a fake clock) and on a real redis-server.
func onBothStores(t *testing.T, play func(t *testing.T, h *hostile)) {
	t.Run("memory", func(t *testing.T) {
		clock := sluicetest.NewClock()
		h := &hostile{clock: clock}
		h.url = h.start(t, "", clock)
		play(t, h)
	})
	t.Run("redis", func(t *testing.T) {
		h := &hostile{redis: redistest.Standalone(t)}
		h.url = h.start(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", h.redis.Addr), nil)
		play(t, h)
	})
}

// start runs abuseConfig with store through server.Run and returns its
// URL.
func (h *hostile) start(t *testing.T, store string, clock sluice.Clock) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, abuseConfig, store), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := server.RunOptions{ConfigPath: path, Getenv: func(k string) string { return hostileEnv[k] }}
	if clock != nil {
		opts.Clock = clock
	}
	return startRunWith(t, opts, "").url
}

// post sends body to path (checkapi.CheckPath, ReleasePath, RenewPath)
// with token, each exchange held to the OpenAPI document, and returns the
// status and the answer.
func (h *hostile) post(t *testing.T, path, token, body string) (int, checkapi.Answer) {
	t.Helper()
	code, raw := call(t, "POST", h.url+path, token, body)
	a, err := checkapi.ParseAnswer([]byte(raw))
	if err != nil {
		t.Fatalf("POST %s %s = %d %s: %v", path, body, code, raw, err)
	}
	return code, a
}

// left returns what policy has left for subject: a peek's remaining, by
// a check-scope client.
func (h *hostile) left(t *testing.T, policy, subject string) int64 {
	t.Helper()
	code, a := h.post(t, checkapi.CheckPath, abuseCheck, fmt.Sprintf(`{"policy":%q,"subject":%q,"cost":0}`, policy, subject))
	if code != 200 && code != 429 {
		t.Fatalf("peek of %s for %s = %d %+v", policy, subject, code, a)
	}
	return a.Remaining
}

// outlive lets d pass: memstore's clock is moved; on Redis, whose own
// clock decides, done is polled (a bounded wait on that process) until
// it holds.
func (h *hostile) outlive(t *testing.T, d time.Duration, done func() bool) {
	t.Helper()
	if h.clock != nil {
		h.clock.Advance(d)
	}
	waitUntil(t, fmt.Sprintf("%v to pass", d), done)
}

// keys returns how many keys the Redis store holds (0 on memstore).
func (h *hostile) keys(t *testing.T) int64 {
	t.Helper()
	if h.redis == nil {
		return 0
	}
	c := h.redis.Client()
	defer c.Close()
	n, err := c.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// abuseRow is one hostile request of the suite (sent times times) and
// what must hold after it. In its bodies, %[1]q is the row's subject.
type abuseRow struct {
	name     string
	token    string   // the caller's; default abuseCheck, noToken for none
	before   []string // sent first, by a client with the check and refund scopes, each answered 200
	body     string
	times    int              // default 1
	code     int              // the last answer's status
	reason   string           // in the last answer's reason
	admitted int              // with times > 1: how many answers were 200
	left     map[string]int64 // what each policy has left for the subject afterwards
	still    bool             // on Redis: body wrote no key
}

// noToken is an abuseRow's token when the caller sends none.
const noToken = "-"

// playRows plays each row against h, each for a subject of its own.
func playRows(t *testing.T, h *hostile, rows []abuseRow) {
	t.Helper()
	for _, r := range rows {
		subj := t.Name() + "/" + r.name
		for _, b := range r.before {
			if code, a := h.post(t, checkapi.CheckPath, abuseRefund, fmt.Sprintf(b, subj)); code != 200 {
				t.Fatalf("%s: before it, %s = %d %+v, want 200", r.name, b, code, a)
			}
		}
		token := cmp.Or(r.token, abuseCheck)
		if token == noToken {
			token = ""
		}
		keys := h.keys(t)
		var code, admitted int
		var a checkapi.Answer
		for range max(r.times, 1) {
			if code, a = h.post(t, checkapi.CheckPath, token, fmt.Sprintf(r.body, subj)); code == 200 {
				admitted++
			}
		}
		body := r.body
		if len(body) > 200 {
			body = body[:200] + "…"
		}
		if code != r.code || !strings.Contains(a.Reason, r.reason) {
			t.Errorf("%s: %s = %d %q, want %d with %q", r.name, body, code, a.Reason, r.code, r.reason)
		}
		if r.times > 1 && admitted != r.admitted {
			t.Errorf("%s: %s sent %d times: %d admitted, want %d", r.name, body, r.times, admitted, r.admitted)
		}
		if n := h.keys(t); r.still && n != keys {
			t.Errorf("%s: Redis held %d keys before %s and %d after, want no new key", r.name, keys, body, n)
		}
		for _, id := range slices.Sorted(maps.Keys(r.left)) {
			if got := h.left(t, id, subj); got != r.left[id] {
				t.Errorf("%s: after %s, %s has %d left, want %d", r.name, body, id, got, r.left[id])
			}
		}
	}
}
