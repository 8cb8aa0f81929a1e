// Package deploy_test checks the deployment files offline, as far as a
// machine without Docker, Kubernetes or Envoy can: the Dockerfile's build
// line builds a static binary, every YAML and JSON file is well formed,
// the sluice configs in them load, and every metric the Grafana
// dashboard queries is served by a real sluice process.
package deploy_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// dockerBuild is the go build line of the Dockerfile's build stage, split
// into its environment and its arguments.
func dockerBuild(t *testing.T) (env, args []string) {
	t.Helper()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	var user string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch fields[0] {
		case "FROM":
			froms = append(froms, fields[1])
		case "USER":
			user = fields[1]
		case "RUN":
			if !strings.Contains(line, "go build") {
				continue
			}
			words := shellWords(t, strings.TrimPrefix(strings.TrimSpace(line), "RUN "))
			for len(words) > 0 && strings.Contains(words[0], "=") {
				env = append(env, words[0])
				words = words[1:]
			}
			if len(words) < 2 || words[0] != "go" || words[1] != "build" {
				t.Fatalf("Dockerfile: RUN line %q: want [VAR=value …] go build …", line)
			}
			args = words[2:]
		}
	}
	if len(froms) < 2 {
		t.Errorf("Dockerfile has %d FROM lines, want a multi-stage build", len(froms))
	}
	if last := froms[len(froms)-1]; !strings.HasPrefix(last, "gcr.io/distroless/static") && last != "scratch" {
		t.Errorf("Dockerfile's final stage is %q, want distroless static or scratch", last)
	}
	if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
		t.Errorf("Dockerfile USER = %q, want a non-root user", user)
	}
	if args == nil {
		t.Fatal("Dockerfile has no RUN … go build line")
	}
	return env, args
}

// shellWords splits a command line as a POSIX shell would for the plain
// words and double-quoted strings a Dockerfile RUN line uses here.
func shellWords(t *testing.T, s string) []string {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quotes in %q", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
	buildDir  string
)

// sluiceBinary builds cmd/sluice once, with the Dockerfile's go build line
// (its -o and package left to servetest.Build, ${VERSION} replaced by
// "deploy-test" and ${REVISION} by deployRevision).
func sluiceBinary(t *testing.T) string {
	t.Helper()
	env, args := dockerBuild(t)
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "sluice-deploy-test")
		if buildErr != nil {
			return
		}
		var flags []string
		for i := 0; i < len(args); i++ {
			switch {
			case args[i] == "-o":
				i++ // servetest.Build names the output
			case args[i] == "./cmd/sluice":
			default:
				flags = append(flags, strings.NewReplacer("${VERSION}", "deploy-test", "${REVISION}", deployRevision).Replace(args[i]))
			}
		}
		// The Dockerfile builds from the repository root.
		binary, buildErr = servetest.Build(context.Background(), "..", buildDir, env, flags...)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// deployRevision is the REVISION build argument of the test's build: a
// commit that is not the clone's, so it can only come from the stamp.
const deployRevision = "0000000000000000000000000000000000dec0de"

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func TestDockerfileBuildsStaticBinary(t *testing.T) {
	env, _ := dockerBuild(t)
	if !contains(env, "CGO_ENABLED=0") {
		t.Errorf("Dockerfile go build environment = %q, want CGO_ENABLED=0 for a static binary", env)
	}
	bin := sluiceBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("the built binary is not ELF: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary has a program interpreter: it is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %q, want none", libs)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if want := "sluice deploy-test\ncommit: " + deployRevision + "\n"; err != nil || !strings.HasPrefix(string(out), want) {
		t.Errorf("sluice version = %q, %v; want the version and commit the build line stamps (%q)", out, err, want)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// yamlDocs decodes every document of a YAML file.
func yamlDocs(t *testing.T, name string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		docs = append(docs, doc)
	}
}

func TestFilesWellFormed(t *testing.T) {
	files, _ := filepath.Glob("*.yaml")
	more, _ := filepath.Glob("ratelimit/*.yaml")
	for _, f := range append(files, more...) {
		if len(yamlDocs(t, f)) == 0 {
			t.Errorf("%s holds no YAML document", f)
		}
	}
	var dash map[string]any
	data, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if ps, _ := dash["panels"].([]any); len(ps) == 0 {
		t.Errorf("grafana-dashboard.json has no panels")
	}
}

// TestConfigsLoad loads the sluice configs and rules of the compose setup
// and of the Kubernetes ConfigMap as sluice serve would.
func TestConfigsLoad(t *testing.T) {
	cfg, err := config.Load("sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Envoy == nil || cfg.Store.Type != config.StoreRedis {
		t.Fatalf("deploy/sluice.yaml: want an envoy section and the Redis store")
	}
	// Its policies are the quota service's (envoy.rlqs); the rate-limit
	// service's limits are the rules files'.
	for _, p := range cfg.Policies {
		named := false
		for _, d := range cfg.Envoy.RLQS.Domains {
			for _, b := range d.Buckets {
				named = named || b.Policy == p.ID
			}
		}
		if !named {
			t.Errorf("deploy/sluice.yaml's policy %s is named by no envoy.rlqs matcher: the rate-limit service's limits are the rules files'", p.ID)
		}
	}
	rs, err := rules.Load(cfg.Envoy.Configs) // relative to this directory, as to the config file
	if err != nil {
		t.Fatal(err)
	}
	if !contains(rs.Domains(), "edge") {
		t.Errorf("deploy/ratelimit domains = %q, want edge (envoy.yaml's domain)", rs.Domains())
	}
	// envoy.yaml's /v1/stream sends (api_key, request_id): an in-flight rule.
	if r, _ := rs.Match("edge", []rules.Entry{{Key: "api_key", Value: "k"}, {Key: "request_id", Value: "r"}}); r == nil || !r.InFlight {
		t.Errorf("deploy/ratelimit: (api_key, request_id) matches %+v, want the in-flight rule envoy.yaml's /v1/stream relies on", r)
	}
	// envoy.yaml's /v1/chat sends (tenant) and sluice's own entries, which
	// the service removes before matching: a rule that settles.
	if r, _ := rs.Match("edge", []rules.Entry{{Key: "tenant", Value: "t"}}); r == nil || !r.Settles {
		t.Errorf("deploy/ratelimit: (tenant) matches %+v, want the settling rule envoy.yaml's /v1/chat relies on", r)
	}
	// envoy.yaml's /v1/batch sends (api_key) and a sluice_priority entry,
	// which the service removes before matching: a rule with that class.
	if r, _ := rs.Match("edge", []rules.Entry{{Key: "api_key", Value: "k"}}); r == nil || r.Policy.Priorities["sheddable"] != 50 {
		t.Errorf("deploy/ratelimit: (api_key) matches %+v, want the rule with the sheddable class envoy.yaml's /v1/batch relies on", r)
	}

	var cm map[string]any
	kinds := map[string]map[string]any{}
	for _, doc := range yamlDocs(t, "kubernetes.yaml") {
		kind, _ := doc["kind"].(string)
		name, _ := doc["metadata"].(map[string]any)["name"].(string)
		kinds[kind+"/"+name] = doc
		if kind == "ConfigMap" {
			cm = doc["data"].(map[string]any)
		}
	}
	for _, want := range []string{"ConfigMap/sluice", "Deployment/sluice", "Service/sluice"} {
		if kinds[want] == nil {
			t.Errorf("kubernetes.yaml lacks %s", want)
		}
	}
	kcfg, err := config.Parse(strings.NewReader(cm["sluice.yaml"].(string)))
	if err != nil {
		t.Fatalf("the ConfigMap's sluice.yaml: %v", err)
	}
	var srcs []rules.Source
	for _, pat := range kcfg.Envoy.Configs {
		for key, body := range cm {
			if ok, _ := filepath.Match(pat, key); ok {
				srcs = append(srcs, rules.Source{Name: key, Data: []byte(body.(string))})
			}
		}
	}
	if len(srcs) == 0 {
		t.Fatalf("no ConfigMap key matches envoy.configs %q", kcfg.Envoy.Configs)
	}
	if _, err := rules.Parse(srcs); err != nil {
		t.Fatalf("the ConfigMap's rules: %v", err)
	}
	// Probes on /healthz and /readyz, never the store's own health
	// (/readyz/store: a Redis outage would empty the Service); a versioned
	// image a kind or minikube node finds (IfNotPresent); the ConfigMap
	// mounted as a directory, without subPath (which would never see an
	// update).
	dep, _ := json.Marshal(kinds["Deployment/sluice"])
	for _, want := range []string{`"path":"/healthz"`, `"path":"/readyz"`, `"configMap":{"name":"sluice"}`, `"runAsNonRoot":true`, `"image":"sluice:v`, `"imagePullPolicy":"IfNotPresent"`} {
		if !bytes.Contains(dep, []byte(want)) {
			t.Errorf("Deployment/sluice lacks %s", want)
		}
	}
	if bytes.Contains(dep, []byte("/readyz/store")) || bytes.Contains(dep, []byte(":latest")) {
		t.Errorf("Deployment/sluice probes /readyz/store or runs a latest image")
	}
	if bytes.Contains(dep, []byte("subPath")) {
		t.Errorf("Deployment/sluice mounts with subPath: ConfigMap updates would never reach sluice")
	}

	env, _ := json.Marshal(yamlDocs(t, "envoy.yaml")[0])
	for _, want := range []string{`"domain":"edge"`, `"cluster_name":"sluice"`, `"port_value":8081`, `"transport_api_version":"V3"`, `"service_name":"envoy.service.ratelimit.v3.RateLimitService"`, `"apply_on_stream_done":true`, `"is_negative_hits":true`, `"descriptor_key":"request_id"`, `"descriptor_key":"sluice_request_id"`, `"descriptor_key":"sluice_stream_done"`, `"descriptor_key":"sluice_priority"`, `"format":"%DYNAMIC_METADATA(sluice:tokens_used)%"`} {
		if !bytes.Contains(env, []byte(want)) {
			t.Errorf("envoy.yaml lacks %s", want)
		}
	}
	compose, _ := json.Marshal(yamlDocs(t, "docker-compose.yaml")[0])
	for _, want := range []string{`"redis":`, `"sluice":`, `"envoy":`, `"dockerfile":"deploy/Dockerfile"`} {
		if !bytes.Contains(compose, []byte(want)) {
			t.Errorf("docker-compose.yaml lacks %s", want)
		}
	}
	checkComposeLoopback(t)
}

// startProcess runs the built binary with serve -c cfg and waits until it
// has logged the check API's address (the proxy's and Envoy's come
// first); it is stopped by its PID at the end.
func startProcess(t *testing.T, bin, cfg string) *servetest.Process {
	t.Helper()
	p, err := servetest.Start(bin, servetest.Options{Timeout: 30 * time.Second}, "serve", "-c", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(15 * time.Second) })
	return p
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

var metricName = regexp.MustCompile(`\b((?:sluice|process|go)_[a-z_]+)\b`)

// TestDashboardAndSIGHUP runs the built binary as a real process with
// every listener (check API, proxy, Envoy rate-limit service), sends each
// some traffic, and checks that every metric the dashboard queries is in
// /metrics. Then it sends SIGHUP, as an operator would, and checks that
// the process reloaded.
func TestDashboardAndSIGHUP(t *testing.T) {
	bin := sluiceBinary(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") }))
	defer up.Close()
	dir := t.TempDir()
	rules, err := os.ReadFile("ratelimit/edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "ratelimit"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ratelimit", "edge.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(`
server: { listen: "127.0.0.1:0" }
policies:
  - { id: api, algorithm: gcra, limit: 100, window: 1s, burst: 20 }
  - { id: batch, algorithm: gcra, limit: 100, window: 1s, priorities: { sheddable: 50% } }
  - { id: slow, algorithm: gcra, limit: 1, window: 10s }
proxy:
  listen: "127.0.0.1:0"
  upstream: "`+up.URL+`"
  routes:
    - { match: { path_prefix: / }, policies: [api] }
envoy:
  listen: "127.0.0.1:0"
  configs: ["ratelimit/*.yaml"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfg)

	// A check of each kind the dashboard's panels count: a plain one, one
	// of a priority class, and a booking told to wait (slow's one unit
	// spent first).
	for _, body := range []string{
		`{"policy":"api","subject":"alice"}`,
		`{"policy":"batch","subject":"alice","priority":"sheddable"}`,
		`{"policy":"slow","subject":"alice"}`,
		`{"policy":"slow","subject":"alice","op":"book","max_wait_ms":60000}`,
	} {
		resp, err := http.Post(p.URL+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /v1/check %s: %s", body, resp.Status)
		}
	}
	get(t, p.ProxyURL()+"/anything")
	conn, err := grpc.NewClient(p.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*commonpb.RateLimitDescriptor{
		{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "198.51.100.7"}}},
	}}); err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	get(t, p.URL+"/healthz") // so sluice_http_requests_total has a series
	exposition := get(t, p.URL+"/metrics")
	served := map[string]bool{}
	for _, line := range strings.Split(exposition, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		served[name] = true
	}
	dash, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var queried []string
	seen := map[string]bool{}
	for _, m := range metricName.FindAllStringSubmatch(string(dash), -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			queried = append(queried, m[1])
		}
	}
	sort.Strings(queried)
	if len(queried) < 5 {
		t.Fatalf("found only %q in the dashboard's queries", queried)
	}
	for _, name := range queried {
		if !served[name] {
			t.Errorf("the dashboard queries %s, which sluice serve does not expose", name)
		}
	}
	if strings.Contains(exposition, "198.51.100.7") || strings.Contains(exposition, "alice") {
		t.Errorf("/metrics holds a raw subject or descriptor value")
	}

	// SIGHUP, sent to the process by its PID.
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var status struct {
		Generation int64 `json:"generation"`
		LastReload struct {
			Trigger, Result string
		} `json:"last_reload"`
	}
	for range 400 {
		if err := json.Unmarshal([]byte(get(t, p.URL+"/v1/config")), &status); err != nil {
			t.Fatal(err)
		}
		if status.Generation == 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if status.Generation != 2 || status.LastReload.Trigger != "signal" || status.LastReload.Result != "success" {
		t.Fatalf("after SIGHUP: %+v, want generation 2 reloaded by the signal\n%s", status, p.Logs())
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
		if err := p.Err(); err != nil {
			t.Errorf("sluice serve after SIGTERM: %v\n%s", err, p.Logs())
		}
	case <-time.After(15 * time.Second):
		t.Errorf("sluice serve did not stop within 15s of SIGTERM")
	}
}

// checkComposeLoopback: every port compose publishes is bound to
// 127.0.0.1 (the check API and /ui are open in that setup).
func checkComposeLoopback(t *testing.T) {
	t.Helper()
	var c struct {
		Services map[string]struct {
			Ports []string `yaml:"ports"`
		} `yaml:"services"`
	}
	data, err := os.ReadFile("docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, svc := range c.Services {
		for _, p := range svc.Ports {
			n++
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("docker-compose.yaml: %s publishes %q on every interface, want 127.0.0.1:…", name, p)
			}
		}
	}
	if n == 0 {
		t.Errorf("docker-compose.yaml publishes no port")
	}
}
