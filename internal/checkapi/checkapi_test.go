package checkapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policyerr"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sluicehq/sluice"
)

// answerOf is the Answer for o, field by field: what AppendAnswer must
// write.
func answerOf(o *sluice.Outcome, reason string) Answer {
	a := Answer{Outcome: o.Kind.String(), Verdict: verdictOf(&o.Status), Reason: reason, Replayed: o.Replayed, Local: o.Local, LeaseID: o.Lease.ID}
	if o.Cause != 0 {
		a.Cause = o.Cause.String()
	}
	for i := range o.Statuses {
		st := &o.Statuses[i]
		kind := sluice.Denied
		if st.Allowed {
			kind = sluice.Allowed
		}
		a.Statuses = append(a.Statuses, Status{Policy: st.Policy, Outcome: kind.String(), Verdict: verdictOf(st)})
	}
	return a
}

func verdictOf(st *sluice.Status) Verdict {
	return Verdict{Allowed: st.Allowed, Limit: st.Limit, Remaining: st.Remaining, ResetAfterMS: ceilMS(st.ResetAfter), RetryAfterMS: ceilMS(st.RetryAfter), Approximate: st.Approximate, DelayMS: ceilMS(st.Delay)}
}

var (
	demo   = sluice.Status{Policy: "demo", Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 10 * time.Second}
	denied = sluice.Status{Policy: "login", Limit: 5, ResetAfter: 7500 * time.Millisecond, RetryAfter: 7500 * time.Millisecond, Approximate: true}
)

// outcomes are answers of every shape, with the reason the server gives.
var outcomes = []struct {
	name   string
	o      sluice.Outcome
	reason string
}{
	{"allowed", sluice.Outcome{Kind: sluice.Allowed, Status: demo}, ""},
	{"denied", sluice.Outcome{Kind: sluice.Denied, Status: denied}, ""},
	{"replayed", sluice.Outcome{Kind: sluice.Allowed, Status: demo, Replayed: true}, ""},
	{"local", sluice.Outcome{Kind: sluice.Allowed, Status: demo, Local: true}, ""},
	{"booked", sluice.Outcome{Kind: sluice.Allowed, Status: sluice.Status{Policy: "api", Allowed: true, Limit: 10, ResetAfter: 1200 * time.Millisecond, Delay: 200 * time.Millisecond}}, ""},
	{"lease", sluice.Outcome{Kind: sluice.Allowed, Status: sluice.Status{Policy: "reports", Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}, Lease: sluice.Lease{ID: "q3Xh0bV8Yx2lC0mQe1o7bA"}}, ""},
	{"several", sluice.Outcome{Kind: sluice.Denied, Status: denied, Statuses: []sluice.Status{demo, denied}}, ""},
	{"unavailable", sluice.Outcome{Kind: sluice.Unavailable, Cause: sluice.CircuitOpen, Err: sluice.CircuitOpen}, "sluice: circuit open"},
	{"indeterminate", sluice.Outcome{Kind: sluice.Indeterminate, Err: sluice.ErrIndeterminate}, "redis: read: i/o timeout"},
	{"unknown policy", sluice.Outcome{Kind: sluice.Incompatible, Err: policyerr.ErrUnknownPolicy}, `sluice: policy "nope": unknown policy`},
	{"cost too high", sluice.Outcome{Kind: sluice.Incompatible, Err: algorithm.ErrCostTooHigh}, `policy "demo": cost = 4: cost above policy maximum 3`},
	{"malformed", sluice.Outcome{Kind: sluice.Incompatible, Err: sluice.ErrInvalidRequest}, "malformed JSON: unexpected end of \"input\"\t<&>\u2028é"},
}

// TestAppendAnswerIsTheDeclaredAnswer: the hand-written answer is byte for
// byte what encoding/json writes for the declared Answer.
func TestAppendAnswerIsTheDeclaredAnswer(t *testing.T) {
	for _, tc := range outcomes {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(answerOf(&tc.o, tc.reason)); err != nil {
			t.Fatal(err)
		}
		if got := AppendAnswer(nil, &tc.o, tc.reason); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%s: AppendAnswer = %s, want %s", tc.name, got, want.Bytes())
		}
	}
}

// TestFieldNames pins the answer's spelling, field by field, to the one
// DESIGN.md and the README give.
func TestFieldNames(t *testing.T) {
	o := sluice.Outcome{Kind: sluice.Unavailable, Cause: sluice.ClockUnsafe, Replayed: true, Lease: sluice.Lease{ID: "L"}, Statuses: []sluice.Status{denied}}
	const want = `{"outcome":"unavailable","allowed":false,"limit":0,"remaining":0,"reset_after_ms":0,"retry_after_ms":0,"approximate":false,"reason":"why","cause":"clock_unsafe","replayed":true,"lease_id":"L",` +
		`"statuses":[{"policy":"login","outcome":"denied","allowed":false,"limit":5,"remaining":0,"reset_after_ms":7500,"retry_after_ms":7500,"approximate":true,"reason":""}]}` + "\n"
	if got := AppendAnswer(nil, &o, "why"); string(got) != want {
		t.Errorf("AppendAnswer = %s, want %s", got, want)
	}
	cost := int64(0)
	r := Request{Policy: "p", Policies: []string{"a"}, Subject: "s", Cost: &cost, Refund: true, Reset: true, EvaluationID: "e", LeaseID: "l"}
	const wantReq = `{"policy":"p","policies":["a"],"subject":"s","cost":0,"refund":true,"reset":true,"evaluation_id":"e","lease_id":"l"}`
	if got, err := json.Marshal(r); err != nil || string(got) != wantReq {
		t.Errorf("json.Marshal(%+v) = %s, %v; want %s", r, got, err, wantReq)
	}
}

// TestOutcomeReadsTheAnswerBack: what the server writes for an outcome,
// read with its status code, is that outcome again.
func TestOutcomeReadsTheAnswerBack(t *testing.T) {
	req := sluice.Request{Policy: "demo", Subject: "alice"}
	for _, tc := range outcomes {
		a, err := ParseAnswer(AppendAnswer(nil, &tc.o, tc.reason))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := req
		if len(tc.o.Statuses) > 0 {
			r = sluice.Request{Policies: []string{"demo", "login"}, Subject: "alice"}
		}
		got := Outcome(StatusCode(&tc.o), &a, &r)
		want := tc.o
		if want.Kind == sluice.Allowed || want.Kind == sluice.Denied {
			if len(want.Statuses) == 0 {
				want.Policy = r.Policy
			}
			if want.Lease.ID != "" {
				want.Lease = sluice.Lease{ID: want.Lease.ID, Subject: "alice", Policies: []string{"demo"}}
			}
		}
		if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(sluice.Outcome{}, "Err")); diff != "" {
			t.Errorf("%s: Outcome(%s) mismatch (-want +got):\n%s", tc.name, AppendAnswer(nil, &tc.o, tc.reason), diff)
		}
		if want.Err != nil && !errors.Is(got.Err, want.Err) {
			t.Errorf("%s: Outcome(…).Err = %v, want it to match %v", tc.name, got.Err, want.Err)
		}
		if want.Err != nil && !strings.Contains(got.Err.Error(), tc.reason) {
			t.Errorf("%s: Outcome(…).Err = %v, want it to carry the reason %q", tc.name, got.Err, tc.reason)
		}
	}
	if _, err := ParseAnswer([]byte("<html>404 page not found</html>")); err == nil {
		t.Errorf("ParseAnswer of an HTML page = nil error, want one")
	}
	if _, err := ParseAnswer([]byte(`{"message":"not found"}`)); err == nil || !strings.Contains(err.Error(), "no outcome") {
		t.Errorf("ParseAnswer of other JSON = %v, want an error saying it has no outcome", err)
	}
}

// TestRequestRoundTrip: a request the client encodes is, once sent as
// JSON, the request the server reads (Acquire aside: the server chooses
// it by the policies named).
func TestRequestRoundTrip(t *testing.T) {
	for _, req := range []sluice.Request{
		{Policy: "demo", Subject: "alice"},
		{Policy: "demo", Subject: "alice", Cost: 2, EvaluationID: "order-42"},
		{Op: sluice.Peek, Policies: []string{"demo", "login"}, Subject: "alice"},
		{Op: sluice.Refund, Policy: "demo", Subject: "alice"},
		{Op: sluice.Refund, Policy: "demo", Subject: "alice", Cost: 2, EvaluationID: "order-42"},
		{Op: sluice.Reset, Policies: []string{"demo", "login"}, Subject: "alice"},
		{Op: sluice.Acquire, Policies: []string{"demo", "reports"}, Subject: "alice", Cost: 3},
		{Op: sluice.Release, Policies: []string{"demo", "reports"}, Subject: "alice", LeaseID: "q3Xh0bV8Yx2lC0mQe1o7bA"},
		{Op: sluice.Renew, Policy: "reports", Subject: "alice", LeaseID: "q3Xh0bV8Yx2lC0mQe1o7bA"},
		{Op: sluice.Book, Policy: "api", Subject: "alice"},
		{Op: sluice.Book, Policy: "api", Subject: "alice", Cost: 3, MaxWait: 250 * time.Millisecond},
	} {
		r, path, err := Encode(req)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", req, err)
		}
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var in Request
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
		var got sluice.Request
		switch path {
		case CheckPath:
			got, err = in.Check()
		case ReleasePath:
			got, err = in.Lease(sluice.Release)
		case RenewPath:
			got, err = in.Lease(sluice.Renew)
		default:
			t.Fatalf("Encode(%+v): path %q", req, path)
		}
		want := req
		if want.Op == sluice.Acquire {
			want.Op = sluice.Spend
		}
		if err != nil || !cmp.Equal(want, got) {
			t.Errorf("Encode(%+v) sent %s to %s, read back as %+v, %v; want %+v", req, data, path, got, err, want)
		}
	}
}

// TestMalformedRequests: what the check API cannot carry, or refuses
// before a Limiter sees it, is an error naming the field, its value and
// the rule, on both sides.
func TestMalformedRequests(t *testing.T) {
	for _, tc := range []struct {
		req  sluice.Request
		want string
	}{
		{sluice.Request{Policy: "demo"}, "subject is required"},
		{sluice.Request{Policy: "demo", Subject: strings.Repeat("a", 1025)}, "subject is 1025 bytes: must be at most 1024"},
		{sluice.Request{Policy: "demo", Subject: "alice", Cost: -1}, "cost = -1: must not be negative"},
		{sluice.Request{Op: sluice.Peek, Policy: "demo", Subject: "alice", Cost: 2}, "cost = 2: a peek takes no cost"},
		{sluice.Request{Op: sluice.Release, Policy: "reports", Subject: "alice"}, "lease id is required"},
		{sluice.Request{Op: sluice.Acquire, Policy: "reports", Subject: "alice", LeaseID: "mine"}, `lease id "mine": only a release or a renewal names one`},
		{sluice.Request{Op: sluice.Renew + 1, Policy: "demo", Subject: "alice"}, "not an operation of the check API"},
		{sluice.Request{Op: sluice.Book, Policy: "api", Subject: "alice", MaxWait: 1500 * time.Microsecond}, "max wait = 1.5ms: the check API carries a whole number of milliseconds"},
		{sluice.Request{Policy: "api", Subject: "alice", MaxWait: time.Second}, "max wait = 1s: only a book waits"},
	} {
		_, _, err := Encode(tc.req)
		if !errors.Is(err, sluice.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Encode(%+v) = %v, want an invalid request saying %q", tc.req, err, tc.want)
		}
	}
	zero, one, day := int64(0), int64(1), int64(86_400_001)
	for _, tc := range []struct {
		in    Request
		lease bool
		want  string
	}{
		{Request{Policy: "demo", Subject: "alice", Refund: true, Reset: true}, false, "set refund or reset, not both"},
		{Request{Policy: "demo", Subject: "alice", Refund: true, Cost: &zero}, false, "a peek or a refund, not both"},
		{Request{Policy: "demo", Subject: "alice", LeaseID: "x"}, false, "lease_id belongs to POST /v1/release and /v1/renew"},
		{Request{Subject: "alice"}, false, "policy is required (or policies)"},
		{Request{Policy: "demo", Policies: []string{"login"}, Subject: "alice"}, true, "set policy or policies, not both"},
		{Request{Policy: "reports", Subject: "alice"}, true, "lease_id is required"},
		{Request{Policy: "reports", Subject: "alice", LeaseID: "x", Cost: &one}, true, "subject and lease_id only"},
		{Request{Policy: "api", Subject: "alice", MaxWaitMS: &one}, false, "max_wait_ms = 1: only a book waits"},
		{Request{Policy: "api", Subject: "alice", Op: "book", MaxWaitMS: &zero}, false, "max_wait_ms = 0: must be 1 to 86400000"},
		{Request{Policy: "api", Subject: "alice", Op: "book", MaxWaitMS: &day}, false, "max_wait_ms = 86400001"},
		{Request{Policy: "api", Subject: "alice", Op: "book", EvaluationID: "e"}, false, "a book takes none"},
		{Request{Policy: "api", Subject: "alice", Op: "book", Cost: &zero}, false, "a book spends 1 or more"},
	} {
		read := tc.in.Check
		if tc.lease {
			read = func() (sluice.Request, error) { return tc.in.Lease(sluice.Release) }
		}
		_, err := read()
		bad, ok := errors.AsType[*RequestError](err)
		if !ok || !strings.Contains(bad.Reason, tc.want) || !errors.Is(err, sluice.ErrInvalidRequest) {
			t.Errorf("reading %+v = %v, want a RequestError saying %q", tc.in, err, tc.want)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `quote " backslash \`, "nl\n tab\t cr\r nul\x00 esc\x1b", "é ü 漢字", "\xff\xfe bad", "line\u2028sep\u2029", "<script>&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendString(%q) = %s: not JSON: %v", s, b, err)
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); got != want && !(!utf8.ValidString(s) && got == invalidToReplacement(s)) {
			t.Fatalf("appendString(%q) decodes to %q, want %q", s, got, want)
		}
	})
}

// invalidToReplacement replaces every invalid byte with U+FFFD, as
// appendString does (strings.ToValidUTF8 merges runs of them).
func invalidToReplacement(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString("\ufffd")
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
