package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/checkpb"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

const grpcRefundToken = "refund-token-0123456789abcdef"

var grpcEnv = map[string]string{"GRPC_CHECK": ovrCheckToken, "GRPC_REFUND": grpcRefundToken}

// grpcCheckConfig serves the check API and, on the Envoy listener, the
// gRPC check service, with a check token and a check-and-refund one.
func grpcCheckConfig(store string) string {
	return `server:
  listen: 127.0.0.1:0
  auth:
    tokens:
      - { id: app, secret_env: GRPC_CHECK, scopes: [check] }
      - { id: ops, secret_env: GRPC_REFUND, scopes: [check, refund] }
` + store + `
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
  - { id: wide, algorithm: gcra, limit: 1000, window: 1h }
  - { id: open, algorithm: gcra, limit: 1000000000, window: 1s }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
`
}

// bothStores runs test on memstore and on a real redis-server.
func bothStores(t *testing.T, test func(t *testing.T, store string)) {
	t.Run("memory", func(t *testing.T) { test(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		test(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }", srv.Addr))
	})
}

// startGRPCCheck runs grpcCheckConfig(store) in this process: the check
// API's URL and a client of the gRPC check service. clientOpts are the
// client's own.
func startGRPCCheck(t *testing.T, store string, clientOpts ...grpc.DialOption) (string, checkpb.CheckServiceClient) {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": grpcCheckConfig(store), "rules/shop.yaml": rulesFile(5)})
	s := startRunWith(t, server.RunOptions{ConfigPath: filepath.Join(dir, "sluice.yaml"), Getenv: func(k string) string { return grpcEnv[k] }}, "")
	m := envoyLine.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no envoy listening line:\n%s", s.logs)
	}
	conn, err := grpc.NewClient(m[1], append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, clientOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s.url, checkpb.NewCheckServiceClient(conn)
}

// withToken returns ctx carrying token as the call's bearer token ("":
// none).
func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// protoOf returns the CheckRequest of body, a POST /v1/check body, with
// id.
func protoOf(t *testing.T, body, id string) *checkpb.CheckRequest {
	t.Helper()
	var in checkapi.Request
	if err := json.Unmarshal([]byte(body), &in); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return &checkpb.CheckRequest{Id: id, Policy: in.Policy, Policies: in.Policies, Subject: in.Subject, Cost: in.Cost, Refund: in.Refund,
		Reset_: in.Reset, EvaluationId: in.EvaluationID, LeaseId: in.LeaseID, Op: in.Op, Priority: in.Priority, MaxWaitMs: in.MaxWaitMS}
}

// comparable returns an answer, JSON (the check API's) or protojson with
// proto names (the gRPC service's), as a map of each field's text,
// zeros left out (each encoding leaves out some) and the times only
// said to be zero or not: the two calls are moments apart, on Redis's
// clock. internal/checkapi's TestToProtoIsTheAnswer holds the numbers
// equal for one outcome.
func comparable(t *testing.T, raw []byte) map[string]string {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	out := map[string]string{}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			switch v := v.(type) {
			case []any:
				for i, e := range v {
					walk(fmt.Sprintf("%s%s[%d].", prefix, k, i), e.(map[string]any))
				}
			default:
				s := fmt.Sprint(v)
				if k == "reset_after_ms" || k == "retry_after_ms" {
					s = strconv.FormatBool(s != "0")
				}
				if s != "0" && s != "false" && s != "" {
					out[prefix+k] = s
				}
			}
		}
	}
	walk("", m)
	return out
}

var protoNames = protojson.MarshalOptions{UseProtoNames: true}

// TestGRPCCheckAnswersAsHTTP sends each check to POST /v1/check and to
// the gRPC service's Check (for a subject of its own: same history,
// separate budgets) and holds the answers alike: a decision (200, 429)
// an answer of the same fields, a refusal the gRPC status of the same
// meaning carrying the same answer.
func TestGRPCCheckAnswersAsHTTP(t *testing.T) { bothStores(t, testGRPCCheckAnswersAsHTTP) }

func testGRPCCheckAnswersAsHTTP(t *testing.T, store string) {
	url, client := startGRPCCheck(t, store)
	for i, tc := range []struct {
		name, token, body string
		code              int
		grpc              codes.Code
	}{
		{"allowed", ovrCheckToken, `{"policy":"demo","subject":"%s-alice"}`, 200, codes.OK},
		{"allowed again", ovrCheckToken, `{"policy":"demo","subject":"%s-alice","cost":2}`, 200, codes.OK},
		{"denied", ovrCheckToken, `{"policy":"demo","subject":"%s-alice"}`, 429, codes.OK},
		{"peek", ovrCheckToken, `{"policy":"demo","subject":"%s-alice","cost":0}`, 429, codes.OK},
		{"several", ovrCheckToken, `{"policies":["wide","demo"],"subject":"%s-bob","evaluation_id":"%[1]s-e1"}`, 200, codes.OK},
		{"replayed", ovrCheckToken, `{"policies":["wide","demo"],"subject":"%s-bob","evaluation_id":"%[1]s-e1"}`, 200, codes.OK},
		{"refund", grpcRefundToken, `{"policy":"demo","subject":"%s-alice","refund":true}`, 200, codes.OK},
		{"bad request", ovrCheckToken, `{"policy":"demo","subject":"%s-alice","cost":-1}`, 400, codes.InvalidArgument},
		{"lease id on a check", ovrCheckToken, `{"policy":"demo","subject":"%s-alice","lease_id":"x"}`, 400, codes.InvalidArgument},
		{"unknown policy", ovrCheckToken, `{"policy":"nope","subject":"%s-alice"}`, 404, codes.NotFound},
		{"cost above the limit", ovrCheckToken, `{"policy":"demo","subject":"%s-carol","cost":4}`, 422, codes.FailedPrecondition},
		{"no token", "", `{"policy":"demo","subject":"%s-alice"}`, 401, codes.Unauthenticated},
		{"unknown token", "not-a-token-0123456789abcdef", `{"policy":"demo","subject":"%s-alice"}`, 401, codes.Unauthenticated},
		{"wrong scope", ovrCheckToken, `{"policy":"demo","subject":"%s-alice","refund":true}`, 403, codes.PermissionDenied},
	} {
		code, raw := call(t, "POST", url+"/v1/check", tc.token, fmt.Sprintf(tc.body, "h"))
		if code != tc.code {
			t.Fatalf("%s: POST /v1/check %s = %d %s, want %d", tc.name, tc.body, code, raw, tc.code)
		}
		id := strconv.Itoa(i)
		ctx, cancel := context.WithTimeout(withToken(context.Background(), tc.token), 10*time.Second)
		resp, err := client.Check(ctx, protoOf(t, fmt.Sprintf(tc.body, "g"), id))
		cancel()
		if got := grpcstatus.Code(err); got != tc.grpc {
			t.Fatalf("%s: Check = %v, want code %v", tc.name, err, tc.grpc)
		}
		if err != nil {
			details := grpcstatus.Convert(err).Details()
			if len(details) != 1 {
				t.Fatalf("%s: Check = %v with details %v, want the answer", tc.name, err, details)
			}
			resp = details[0].(*checkpb.CheckResponse)
			if msg := grpcstatus.Convert(err).Message(); msg != resp.Reason {
				t.Errorf("%s: Check's status message = %q, want the answer's reason %q", tc.name, msg, resp.Reason)
			}
		}
		if resp.Id != id || resp.HttpStatus != int32(code) {
			t.Errorf("%s: Check's id, http_status = %q, %d; want %q, %d", tc.name, resp.Id, resp.HttpStatus, id, code)
		}
		resp.Id, resp.HttpStatus = "", 0
		pb, err := protoNames.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(comparable(t, []byte(raw)), comparable(t, pb)); diff != "" {
			t.Errorf("%s: Check's answer differs from POST /v1/check's (-http +grpc):\n%s", tc.name, diff)
		}
	}
}

// TestGRPCCheckStream sends 64 mixed checks on one CheckStream before
// reading any answer: every one is answered once, under its own id, with
// the status POST /v1/check gives it; of two spends of a 1-unit budget
// one is allowed and one denied, whichever comes first.
func TestGRPCCheckStream(t *testing.T) { bothStores(t, testGRPCCheckStream) }

func testGRPCCheckStream(t *testing.T, store string) {
	_, client := startGRPCCheck(t, store)
	ctx, cancel := context.WithTimeout(withToken(context.Background(), ovrCheckToken), 30*time.Second)
	defer cancel()
	stream, err := client.CheckStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int32{}
	var pair []string // the two spends of demo's last unit for one subject
	for i := range 64 {
		id := fmt.Sprintf("c-%d", i)
		in := &checkpb.CheckRequest{Id: id, Policy: "open", Subject: fmt.Sprintf("user-%d", i)}
		want[id] = 200
		switch i % 8 {
		case 1:
			in.Subject = "" // 400
			want[id] = 400
		case 2:
			in.Policy = "nope"
			want[id] = 404
		case 3:
			in.Refund = true // the check token lacks refund: 403
			want[id] = 403
		case 4:
			in.Policies, in.Policy = []string{"wide", "open"}, ""
		case 5:
			in.Policy, in.Cost = "demo", new(int64(3)) // spends demo whole: 200
			in.Subject = fmt.Sprintf("full-%d", i)
		case 6:
			in.Policy, in.Subject = "demo", fmt.Sprintf("pair-%d", i/8)
			in.Cost = new(int64(2))
			pair = append(pair, id)
		case 7:
			in.Policy, in.Subject = "demo", fmt.Sprintf("pair-%d", i/8)
			in.Cost = new(int64(2))
			pair = append(pair, id)
		}
		if err := stream.Send(in); err != nil {
			t.Fatalf("Send(%s): %v", id, err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := map[string]*checkpb.CheckResponse{}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Recv after %d answers: %v", len(got), err)
		}
		if _, dup := got[resp.Id]; dup {
			t.Errorf("%s answered twice", resp.Id)
		}
		got[resp.Id] = resp
	}
	if len(got) != 64 {
		t.Fatalf("got %d answers, want 64", len(got))
	}
	for i := 0; i < len(pair); i += 2 {
		a, b := got[pair[i]], got[pair[i+1]]
		if a == nil || b == nil || a.HttpStatus+b.HttpStatus != 200+429 {
			t.Errorf("two spends of 2 of demo's 3 for one subject = %v and %v, want one 200 and one 429", a, b)
		}
		delete(want, pair[i])
		delete(want, pair[i+1])
	}
	for id, code := range want {
		if resp := got[id]; resp == nil || resp.HttpStatus != code {
			t.Errorf("%s answered %v, want http_status %d", id, resp, code)
		}
	}
}

// streamGoroutines counts the goroutines of the CheckStream calls in
// this process: their handlers' and their checks'.
func streamGoroutines() (handlers, checks int) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		switch {
		case strings.Contains(g, "server.(*checkStream).check("):
			checks++
		case strings.Contains(g, "server.(*checkService).CheckStream("):
			handlers++
		}
	}
	return handlers, checks
}

// TestGRPCCheckStreamCut fills a CheckStream whose client sends and
// never reads: once the client's receive window is full, the server
// holds 64 checks in flight and reads no more. The client then cancels
// the stream: every goroutine of the call returns, and a check after it
// is decided as usual.
func TestGRPCCheckStreamCut(t *testing.T) { bothStores(t, testGRPCCheckStreamCut) }

func testGRPCCheckStreamCut(t *testing.T, store string) {
	// A fixed window turns off the growth of the window by bandwidth
	// estimates: the server's answers fill it and wait.
	_, client := startGRPCCheck(t, store, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithCancel(withToken(context.Background(), ovrCheckToken))
	defer cancel()
	stream, err := client.CheckStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan int, 1)
	go func() {
		n := 0
		for ; n < 100_000; n++ {
			if stream.Send(&checkpb.CheckRequest{Id: strconv.Itoa(n), Policy: "open", Subject: "user-" + strconv.Itoa(n%1000)}) != nil {
				break
			}
		}
		sent <- n
	}()
	most := 0
	waitUntil(t, "64 checks in flight on the stream", func() bool {
		_, checks := streamGoroutines()
		most = max(most, checks)
		return checks >= 64
	})
	if most > 64 {
		t.Errorf("%d checks in flight on one stream, want at most 64", most)
	}
	cancel()
	if n := <-sent; n == 100_000 {
		t.Errorf("the client sent all %d checks to a server that stopped reading", n)
	}
	waitUntil(t, "the cut stream's goroutines to return", func() bool {
		handlers, checks := streamGoroutines()
		return handlers == 0 && checks == 0
	})
	ctx2, cancel2 := context.WithTimeout(withToken(context.Background(), ovrCheckToken), 10*time.Second)
	defer cancel2()
	resp, err := client.Check(ctx2, &checkpb.CheckRequest{Id: "after", Policy: "demo", Subject: "after-the-cut"})
	if err != nil || resp.HttpStatus != 200 || resp.Remaining != 2 {
		t.Fatalf("Check after the cut = %v, %v; want allowed with 2 remaining", resp, err)
	}
}
