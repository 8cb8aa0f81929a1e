package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var envoyListening = regexp.MustCompile(`msg="envoy rate-limit service listening" addr=(\S+)`)

// TestOverrideEnvoySubject: sluice override set names a subject as the
// Envoy service sees it (--envoy-domain, --descriptor) and the service
// gives it the plan's numbers; rm takes them back.
func TestOverrideEnvoySubject(t *testing.T) {
	t.Setenv("SLUICE_TEST_OVR_ADMIN", "admin-token-0123456789abcdef")
	t.Setenv("SLUICE_TEST_OVR_HMAC", "hmac-secret-0123456789abcdef0123456789")
	cfg := writeConfig(t, `server:
  listen: 127.0.0.1:0
  auth:
    tokens: [{ id: ops, secret_env: SLUICE_TEST_OVR_ADMIN, scopes: [admin] }]
subjects:
  hmac_keys: [{ id: k1, secret_env: SLUICE_TEST_OVR_HMAC }]
envoy:
  listen: "127.0.0.1:0"
  configs: ["shop.yaml"]
`)
	rules := "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2, align: first_request }\n"
	if err := os.WriteFile(filepath.Join(filepath.Dir(cfg), "shop.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "--config", cfg)
	m := envoyListening.FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no envoy listening line:\n%s", s.logs)
	}
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	left := func(user string) uint32 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d := &commonpb.RateLimitDescriptor{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "user", Value: user}}, HitsAddend: wrapperspb.UInt64(0)}
		resp, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].LimitRemaining
	}
	override := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := exitCode(run(context.Background(), append([]string{"override"}, args...), &out, &errOut), &errOut)
		return out.String(), errOut.String(), code
	}
	out, errOut, code := override("set", "--url", s.url, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--envoy-domain", "shop", "--descriptor", "user=acme", "--limit", "7", "--note", "acme plan")
	if code != 0 || !strings.Contains(out, "shop.user") || !strings.Contains(out, "acme plan") || strings.Contains(out, "acme\t") {
		t.Fatalf("override set --envoy-domain = %d %q %q", code, out, errOut)
	}
	if n := left("acme"); n != 7 {
		t.Errorf("acme's remaining after the plan = %d, want 7", n)
	}
	if n := left("other"); n != 2 {
		t.Errorf("another user's remaining = %d, want the rule's 2", n)
	}
	if _, errOut, code := override("rm", "--url", s.url, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--envoy-domain", "shop", "--descriptor", "user=acme"); code != 0 {
		t.Fatalf("override rm --envoy-domain = %d %q", code, errOut)
	}
	if n := left("acme"); n != 2 {
		t.Errorf("acme's remaining after rm = %d, want the rule's 2", n)
	}
	for _, args := range [][]string{
		{"set", "--envoy-domain", "shop", "--limit", "3"},
		{"set", "--descriptor", "user=x", "--limit", "3"},
		{"set", "--envoy-domain", "shop", "--descriptor", "user=x", "--subject", "x", "--limit", "3"},
		{"set", "--envoy-domain", "shop", "--descriptor", "novalue", "--limit", "3"},
	} {
		if _, errOut, code := override(args...); code != 2 {
			t.Errorf("override %q = exit %d %q, want a usage error (2)", args, code, errOut)
		}
	}
}

// TestOverrideProxyClient: sluice override set names a client of a proxy
// route (--proxy-route with --client-ip or --header-value), and the
// proxy gives that client the plan's numbers.
func TestOverrideProxyClient(t *testing.T) {
	t.Setenv("SLUICE_TEST_OVR_ADMIN", "admin-token-0123456789abcdef")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	cfg := writeConfig(t, `server:
  listen: 127.0.0.1:0
  auth:
    tokens: [{ id: ops, secret_env: SLUICE_TEST_OVR_ADMIN, scopes: [admin] }]
policies:
  - { id: login, algorithm: fixed_window, limit: 1, window: 1h }
proxy:
  listen: "127.0.0.1:0"
  upstream: "`+up.URL+`"
  routes:
    - { match: { path_prefix: /login }, policies: [login], subject: ip }
`)
	s := startServe(t, "--config", cfg)
	m := regexp.MustCompile(`msg="proxy listening" addr=(http://\S+)`).FindStringSubmatch(s.logs.String())
	if m == nil {
		t.Fatalf("no proxy listening line:\n%s", s.logs)
	}
	var out, errOut bytes.Buffer
	args := []string{"override", "set", "--url", s.url, "--token-env", "SLUICE_TEST_OVR_ADMIN", "--proxy-route", "0", "--client-ip", "127.0.0.1", "--limit", "3", "--note", "office"}
	if code := exitCode(run(context.Background(), args, &out, &errOut), &errOut); code != 0 || !strings.Contains(out.String(), "login") {
		t.Fatalf("override set --proxy-route = %d %q %q", code, out.String(), errOut.String())
	}
	ok := 0
	for range 5 {
		resp, err := http.Get(m[1] + "/login")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			ok++
		}
	}
	if ok != 3 {
		t.Errorf("this address under its plan of 3: %d admitted, want 3", ok)
	}
	errOut.Reset()
	if code := exitCode(run(context.Background(), []string{"override", "set", "--proxy-route", "0", "--limit", "3"}, &out, &errOut), &errOut); code != 2 {
		t.Errorf("--proxy-route without a client = exit %d %q, want 2", code, errOut.String())
	}
}
