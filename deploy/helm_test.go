package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rules"
)

// helmEnv names the helm binary TestHelmChart renders the chart with:
// make test's chart step builds it (helm.sh/helm/v4 at a named version,
// run from its own module, not this one's go.mod) and sets it. Without it
// the test skips: a plain go test needs no helm.
const helmEnv = "SLUICE_HELM"

// TestHelmChart renders deploy/helm/sluice for each store type (and once
// with TLS, tokens, a Redis password, Envoy and a ServiceMonitor) and
// checks what it renders: sluice.yaml loads with the store asked for; the
// readiness probe is GET /readyz (ready while a policy is answered
// without the store) and no probe uses the store's own health
// (/readyz/store); the image is a versioned tag pulled IfNotPresent; a
// PodDisruptionBudget, GOMEMLIMIT and a non-root security context are
// there.
func TestHelmChart(t *testing.T) {
	helm := os.Getenv(helmEnv)
	if helm == "" {
		t.Skipf("%s is unset: make test's chart step sets it to a helm binary", helmEnv)
	}
	for _, tc := range []struct {
		name  string
		set   []string
		store string // the sluice.yaml store.redis mode; "" one Redis, "memory" none
		kinds []string
	}{
		{"memory", nil, "memory", nil},
		{"redis", []string{"store.type=redis"}, "", nil},
		{"cluster", []string{"store.type=cluster", "store.redis.addrs={redis-0:6379,redis-1:6379,redis-2:6379}"}, config.ModeCluster, nil},
		{"sentinel", []string{"store.type=sentinel", "store.redis.addrs={sentinel-0:26379,sentinel-1:26379}", "store.redis.masterName=mymaster"}, config.ModeSentinel, nil},
		{"everything", []string{"store.type=redis", "tls.enabled=true", "tls.secretName=sluice-tls", "serviceMonitor.enabled=true"}, "", []string{"ServiceMonitor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "sluice", "helm/sluice"}
			if tc.name == "everything" {
				args = append(args, "-f", "testdata/helm-everything.yaml")
			}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := exec.Command(helm, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			docs := renderedDocs(t, out)
			for _, want := range append([]string{"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}, tc.kinds...) {
				if docs[want] == nil {
					t.Errorf("rendered no %s (kinds: %v)", want, keys(docs))
				}
			}
			checkRenderedConfig(t, docs["ConfigMap"], docs["ConfigMap/rules"], tc.store)
			checkRenderedDeployment(t, docs["Deployment"])
		})
	}
}

// renderedDocs returns helm template's documents by kind (the first of
// each; the Envoy rules' ConfigMap is the second).
func renderedDocs(t *testing.T, out []byte) map[string]map[string]any {
	t.Helper()
	docs := map[string]map[string]any{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("helm template's output: %v\n%s", err, out)
		}
		kind, _ := doc["kind"].(string)
		if doc == nil || docs[kind] != nil {
			if kind == "ConfigMap" {
				docs["ConfigMap/rules"] = doc
			}
			continue
		}
		docs[kind] = doc
	}
}

// checkRenderedConfig parses the ConfigMap's sluice.yaml as sluice serve
// does and checks its store; with an envoy section, the rules' ConfigMap
// parses too.
func checkRenderedConfig(t *testing.T, cm, rulesCM map[string]any, store string) {
	t.Helper()
	data, _ := cm["data"].(map[string]any)
	raw, _ := data["sluice.yaml"].(string)
	cfg, err := config.Parse(strings.NewReader(raw))
	if err != nil {
		t.Fatalf("the ConfigMap's sluice.yaml: %v\n%s", err, raw)
	}
	switch {
	case store == "memory" && cfg.Store.Type != config.StoreMemory:
		t.Errorf("store.type = %q, want memory", cfg.Store.Type)
	case store != "memory" && (cfg.Store.Type != config.StoreRedis || cfg.Store.Redis == nil || cfg.Store.Redis.Mode != store):
		t.Errorf("store = %+v, want redis in mode %q", cfg.Store, store)
	}
	if cfg.Envoy == nil {
		return
	}
	files, _ := rulesCM["data"].(map[string]any)
	var srcs []rules.Source
	for name, body := range files {
		srcs = append(srcs, rules.Source{Name: name, Data: []byte(body.(string))})
	}
	if len(srcs) == 0 {
		t.Fatalf("envoy is on, but the rules' ConfigMap holds no file")
	}
	if _, err := rules.Parse(srcs); err != nil {
		t.Errorf("the rules' ConfigMap: %v", err)
	}
}

// checkRenderedDeployment checks the probes, the image and the pod's
// settings.
func checkRenderedDeployment(t *testing.T, dep map[string]any) {
	t.Helper()
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					SecurityContext struct {
						RunAsNonRoot bool `json:"runAsNonRoot"`
					} `json:"securityContext"`
					Containers []struct {
						Image           string `json:"image"`
						ImagePullPolicy string `json:"imagePullPolicy"`
						Env             []struct {
							Name string `json:"name"`
						} `json:"env"`
						ReadinessProbe, LivenessProbe, StartupProbe *struct {
							HTTPGet struct {
								Path string `json:"path"`
							} `json:"httpGet"`
						}
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	b, _ := json.Marshal(dep)
	if err := json.Unmarshal(b, &d); err != nil || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment: %v (%s)", err, b)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe = %+v, want GET /readyz", c.ReadinessProbe)
	}
	if bytes.Contains(b, []byte("/readyz/store")) {
		t.Errorf("the Deployment probes /readyz/store, the store's own health: a Redis outage would take every pod out of the Service")
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe = %+v, want GET /healthz", c.LivenessProbe)
	}
	if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(c.Image, ":v") || c.ImagePullPolicy != "IfNotPresent" {
		t.Errorf("image %q pulled %q, want a versioned tag pulled IfNotPresent", c.Image, c.ImagePullPolicy)
	}
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name)
	}
	if !contains(env, "GOMEMLIMIT") || !contains(env, "SLUICE_HMAC_K1") {
		t.Errorf("env = %v, want GOMEMLIMIT and SLUICE_HMAC_K1", env)
	}
	if !d.Spec.Template.Spec.SecurityContext.RunAsNonRoot {
		t.Errorf("the pod may run as root")
	}
}

func keys(m map[string]map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
