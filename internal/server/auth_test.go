package server_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/subject"
)

var (
	appToken = server.Token{ID: "app", Secret: []byte("app-secret-0123456789"), Scopes: []string{"check"}}
	opsToken = server.Token{ID: "ops", Secret: []byte("ops-secret-0123456789"), Scopes: []string{"check", "refund", "reset"}}
)

// send posts body to /v1/check with an Authorization header (none when
// auth is "") and returns the status, the reason and WWW-Authenticate.
func send(t *testing.T, url, auth, body string) (int, string, string) {
	t.Helper()
	return sendTo(t, url+"/v1/check", auth, body)
}

// sendTo is send to another endpoint, a whole URL.
func sendTo(t *testing.T, url, auth, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("body %q: %v", raw, err)
	}
	return resp.StatusCode, a.Reason, resp.Header.Get("WWW-Authenticate")
}

func TestBearerTokens(t *testing.T) {
	f := newFixture(t, demoPolicies, server.Options{Tokens: []server.Token{appToken, opsToken}})
	const spend, refund, reset = `{"policy":"login","subject":"alice"}`, `{"policy":"login","subject":"alice","refund":true}`, `{"policy":"login","subject":"alice","reset":true}`
	type result struct {
		Code   int
		Reason string
		Auth   string
	}
	for _, tt := range []struct {
		name, auth, body string
		want             result
	}{
		{"no token", "", spend, result{401, "a valid bearer token is required: Authorization: Bearer <token>", `Bearer realm="sluice"`}},
		{"wrong token", "Bearer app-secret-012345678X", spend, result{401, "a valid bearer token is required: Authorization: Bearer <token>", `Bearer realm="sluice"`}},
		{"basic auth", "Basic YXBwOmFwcA==", spend, result{401, "a valid bearer token is required: Authorization: Bearer <token>", `Bearer realm="sluice"`}},
		{"check scope spends", "Bearer app-secret-0123456789", spend, result{200, "", ""}},
		{"scheme is case-insensitive", "bearer app-secret-0123456789", spend, result{200, "", ""}},
		{"check scope cannot refund", "Bearer app-secret-0123456789", refund, result{403, `token "app" lacks scope refund`, `Bearer realm="sluice", error="insufficient_scope", scope="refund"`}},
		{"refund scope refunds", "Bearer ops-secret-0123456789", refund, result{200, "", ""}},
		{"check scope cannot reset", "Bearer app-secret-0123456789", reset, result{403, `token "app" lacks scope reset`, `Bearer realm="sluice", error="insufficient_scope", scope="reset"`}},
		{"reset scope resets", "Bearer ops-secret-0123456789", reset, result{200, "", ""}},
		{"malformed body with a token", "Bearer app-secret-0123456789", `{"policy":"login"}`, result{400, "subject is required", ""}},
	} {
		code, reason, challenge := send(t, f.url, tt.auth, tt.body)
		if diff := cmp.Diff(tt.want, result{code, reason, challenge}); diff != "" {
			t.Errorf("%s: answer diff (-want +got):\n%s", tt.name, diff)
		}
	}
	// The health checks stay open for probes.
	resp, err := http.Get(f.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /healthz without a token: %d, want 200", resp.StatusCode)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "token=ops") || strings.Contains(logs, "secret-0123456789") {
		t.Errorf("logs %s: want the token ID, never its secret", logs)
	}
}

func TestNewRejectsBadTokens(t *testing.T) {
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	lim, err := sluice.New(ms, demoPolicies, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		tokens []server.Token
		want   string
	}{
		{"short secret", []server.Token{{ID: "a", Secret: []byte("short"), Scopes: []string{"check"}}}, "server: New: Tokens[0] (a): secret is 5 bytes: must be at least 16"},
		{"no scopes", []server.Token{{ID: "a", Secret: appToken.Secret}}, "server: New: Tokens[0] (a): no scopes"},
		{"unknown scope", []server.Token{{ID: "a", Secret: appToken.Secret, Scopes: []string{"superuser"}}}, `server: New: Tokens[0] (a): scope "superuser": must be one of check, refund, reset, admin`},
		{"same secret twice", []server.Token{appToken, {ID: "b", Secret: appToken.Secret, Scopes: []string{"refund"}}}, "server: New: Tokens[1] (b): same secret as token app"},
	} {
		_, err := server.New(lim, subject.Unkeyed(), slog.New(slog.DiscardHandler), server.Options{Tokens: tt.tokens})
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%s: New error = %v, want %q", tt.name, err, tt.want)
		}
	}
}
