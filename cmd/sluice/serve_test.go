package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key
// to dir and returns their paths and a pool that trusts the certificate.
func writeCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test"},
		NotBefore:             time.Unix(0, 0),
		NotAfter:              time.Unix(1<<33, 0),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return certFile, keyFile, pool
}

func TestServeTLSWithTokens(t *testing.T) {
	certFile, keyFile, pool := writeCert(t, t.TempDir())
	t.Setenv("SLUICE_TEST_TOKEN_APP", "app-token-0123456789")
	t.Setenv("SLUICE_TEST_TOKEN_OPS", "ops-token-0123456789")
	cfg := writeConfig(t, `
server:
  listen: "127.0.0.1:0"
  tls: { cert_file: "`+certFile+`", key_file: "`+keyFile+`" }
  auth:
    tokens:
      - { id: app, secret_env: SLUICE_TEST_TOKEN_APP, scopes: [check] }
      - { id: ops, secret_env: SLUICE_TEST_TOKEN_OPS, scopes: [check, refund] }
policies:
  - { id: demo, algorithm: fixed_window, limit: 3, window: 1h }
`)
	s := startServe(t, "-c", cfg)
	if !strings.HasPrefix(s.url, "https://127.0.0.1:") {
		t.Fatalf("serve logged address %s, want https://127.0.0.1:…", s.url)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	post := func(token, body string) int {
		t.Helper()
		req, err := http.NewRequest("POST", s.url+"/v1/check", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	const spend, refund = `{"policy":"demo","subject":"alice"}`, `{"policy":"demo","subject":"alice","refund":true}`
	got := []int{post("", spend), post("app-token-0123456789", spend), post("app-token-0123456789", refund), post("ops-token-0123456789", refund)}
	if want := []int{401, 200, 403, 200}; !equalInts(got, want) {
		t.Errorf("statuses %v, want %v (no token, check, refund without scope, refund)", got, want)
	}
	// Plain HTTP to the TLS listener gets no answer from the check API.
	if resp, err := http.Post(strings.Replace(s.url, "https://", "http://", 1)+"/v1/check", "application/json", strings.NewReader(spend)); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("plain HTTP to the TLS listener answered 200")
		}
	}

	// The check command authenticates with a token from the environment.
	var out, errOut bytes.Buffer
	args := []string{"check", "--url", s.url, "--ca-file", certFile, "--token-env", "SLUICE_TEST_TOKEN_APP", "--policy", "demo", "--subject", "bob"}
	if code := exitCode(run(context.Background(), args, &out, &errOut), &errOut); code != 0 || !strings.Contains(out.String(), `"outcome":"allowed"`) {
		t.Errorf("check with --token-env = %d, stdout %q, stderr %q; want 0 allowed", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := exitCode(run(context.Background(), args[:5], &out, &errOut), &errOut); code != 2 {
		t.Errorf("check without --policy = %d, want 2", code)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestServeJSONLogs(t *testing.T) {
	s := startServe(t, "-c", writeConfig(t, demoConfig), "--log-format", "json")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(s.logs.String()), "\n")
	var warned bool
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		msg, _ := rec["msg"].(string)
		if rec["level"] == "WARN" && strings.HasPrefix(msg, "subjects.hmac_keys is not configured") {
			warned = true
		}
		if strings.Contains(msg, "WARNING") {
			t.Errorf("log record %q says WARNING beside its level", line)
		}
	}
	if !warned {
		t.Errorf("logs %s: want the warning about subjects.hmac_keys", s.logs.String())
	}
}

func TestServeNamesTheListenAddress(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	cfg := writeConfig(t, "server: { listen: \""+addr+"\" }\npolicies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]\n")
	err = run(context.Background(), []string{"serve", "-c", cfg}, io.Discard, io.Discard)
	if want := `serve: server.listen "` + addr + `": listen tcp ` + addr; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("serve on a taken port = %v, want an error starting %q", err, want)
	}
}

// validate reports every error of the file, and what serve would refuse
// in the environment.
func TestValidateReportsEverything(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		want       []string // lines of stderr after "sluice: FILE: "
	}{
		{"several errors", `
server: { listen: "localhost" }
policies:
  - { id: demo, algorithm: fixed_window, limit: 0, window: 10s }
  - { id: login, algorithm: leaky_bucket, limit: 5, window: 1m }
`, nil, []string{
			`server.listen: "localhost": must be host:port, such as 127.0.0.1:8080 (line 2)`,
			`policies[0].limit: 0: must be between 1 and 1000000000 (line 4)`,
			`policies[1].algorithm: "leaky_bucket": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 5)`,
		}},
		{"unset secrets", `
server:
  auth:
    tokens: [{ id: app, secret_env: SLUICE_TEST_UNSET_TOKEN, scopes: [check] }]
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
subjects:
  hmac_keys: [{ id: k1, secret_env: SLUICE_TEST_UNSET_HMAC }]
`, map[string]string{"SLUICE_TEST_UNSET_TOKEN": "", "SLUICE_TEST_UNSET_HMAC": ""}, []string{
			// By line, as the file's own problems are.
			`server.auth.tokens[0].secret_env: "SLUICE_TEST_UNSET_TOKEN": environment variable SLUICE_TEST_UNSET_TOKEN is not set or empty (line 4)`,
			`subjects.hmac_keys[0].secret_env: "SLUICE_TEST_UNSET_HMAC": environment variable SLUICE_TEST_UNSET_HMAC is not set or empty (line 7)`,
		}},
		{"rules and environment together", `
policies:
  - { id: demo, algorithm: leaky_bucket, limit: 3, window: 10s }
subjects:
  hmac_keys: [{ id: k1, secret_env: SLUICE_TEST_UNSET_HMAC }]
`, map[string]string{"SLUICE_TEST_UNSET_HMAC": ""}, []string{
			`policies[0].algorithm: "leaky_bucket": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 3)`,
			`subjects.hmac_keys[0].secret_env: "SLUICE_TEST_UNSET_HMAC": environment variable SLUICE_TEST_UNSET_HMAC is not set or empty (line 5)`,
		}},
		{"bad port", `
store:
  type: redis
  redis: { url: "redis://127.0.0.1:notaport/0" }
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
`, nil, []string{
			`store.redis.url: "redis://127.0.0.1:notaport/0": the port must be a number between 1 and 65535, such as redis://127.0.0.1:6379/0 (line 4)`,
		}},
		{"bad database", `
store:
  type: redis
  redis: { url: "redis://127.0.0.1:6379/x" }
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
`, nil, []string{
			`store.redis.url: "redis://127.0.0.1:6379/x": the database number "x" must be a whole number such as 0, such as redis://127.0.0.1:6379/0 (line 4)`,
		}},
		{"an option the Redis client rejects", `
store:
  type: redis
  redis: { url: "redis://127.0.0.1:6379/0?pool_size=many" }
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
`, nil, []string{
			`store.redis.url: "redis://127.0.0.1:6379/0?pool_size=many": invalid pool_size number: strconv.Atoi: parsing "many": invalid syntax (line 4)`,
		}},
		{"missing TLS files", `
server:
  tls: { cert_file: /nonexistent/tls.crt, key_file: /nonexistent/tls.key }
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
`, nil, []string{
			`server.tls: cannot load the certificate and key: open /nonexistent/tls.crt: no such file or directory (line 3)`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			path := writeConfig(t, tc.yaml)
			var out, errOut bytes.Buffer
			code := exitCode(run(context.Background(), []string{"validate", "-c", path}, &out, &errOut), &errOut)
			var want []string
			for _, w := range tc.want {
				want = append(want, "sluice: "+path+": "+w)
			}
			if got := strings.Split(strings.TrimSpace(errOut.String()), "\n"); code != 1 || !equalStrings(got, want) {
				t.Errorf("validate exit %d, stderr:\n%s\nwant exit 1 and:\n%s", code, errOut.String(), strings.Join(want, "\n"))
			}
			if out.Len() != 0 {
				t.Errorf("validate printed %q on stdout", out.String())
			}
		})
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// docs/cli.md tells users to run validate on the repository's sluice.yaml.
func TestRepositoryConfigValidates(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"validate", "--config", filepath.Join("..", "..", "sluice.yaml")}, &out, &errOut)
	if err != nil || out.String() != "ok\n" {
		t.Errorf("validate sluice.yaml = %v, stdout %q, stderr %q; want ok", err, out.String(), errOut.String())
	}
}
