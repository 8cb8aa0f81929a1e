package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strconv"
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
		{"memory bound", []string{"store.memory.maxKeys=200000", "replicaCount=1"}, "memory", nil},
		{"redis", []string{"store.type=redis"}, "", nil},
		{"cluster", []string{"store.type=cluster", "store.redis.addrs={redis-0:6379,redis-1:6379,redis-2:6379}"}, config.ModeCluster, nil},
		{"sentinel", []string{"store.type=sentinel", "store.redis.addrs={sentinel-0:26379,sentinel-1:26379}", "store.redis.masterName=mymaster"}, config.ModeSentinel, nil},
		{"everything", []string{"store.type=redis", "tls.enabled=true", "tls.secretName=sluice-tls", "serviceMonitor.enabled=true"}, "", []string{"ServiceMonitor", "NetworkPolicy"}},
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
			cfg := checkRenderedConfig(t, docs["ConfigMap"], docs["ConfigMap/rules"], tc.store)
			if want := memoryBound(tc.set); (cfg.Store.Memory == nil && want != 0) || (cfg.Store.Memory != nil && cfg.Store.Memory.MaxKeys != want) {
				t.Errorf("store.memory = %+v, want max_keys %d (0: none, derived from GOMEMLIMIT)", cfg.Store.Memory, want)
			}
			checkRenderedDeployment(t, docs["Deployment"])
			if np := docs["NetworkPolicy"]; np != nil {
				checkRenderedNetworkPolicy(t, np)
			}
		})
	}
}

// memoryBound is the store.memory.maxKeys a case sets, 0 when none.
func memoryBound(set []string) int64 {
	for _, s := range set {
		if v, ok := strings.CutPrefix(s, "store.memory.maxKeys="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// TestHelmChartRefuses: values that would render a config sluice refuses,
// or a bound outside max_keys's range, fail helm template with the field
// and the reason, from the values schema; without the schema
// (--skip-schema-validation) the template itself still refuses a cluster
// or Sentinel store without addresses.
func TestHelmChartRefuses(t *testing.T) {
	helm := os.Getenv(helmEnv)
	if helm == "" {
		t.Skipf("%s is unset: make test's chart step sets it to a helm binary", helmEnv)
	}
	for _, tc := range []struct {
		name string
		set  []string
		want []string // each in the output
	}{
		{"cluster without addrs", []string{"store.type=cluster"}, []string{"at '/store/redis/addrs': minItems: got 0, want 1"}},
		{"sentinel without addrs", []string{"store.type=sentinel"}, []string{"at '/store/redis/addrs': minItems: got 0, want 1"}},
		{"sentinel without a master", []string{"store.type=sentinel", "store.redis.addrs={sentinel-0:26379}", "store.redis.masterName="}, []string{"at '/store/redis/masterName': minLength: got 0, want 1"}},
		{"cluster seed without a port", []string{"store.type=cluster", "store.redis.addrs={redis-0}"}, []string{"at '/store/redis/addrs/0'"}},
		{"unknown store", []string{"store.type=memcached"}, []string{"at '/store/type'", "memory", "sentinel"}},
		{"bound too small", []string{"store.memory.maxKeys=10"}, []string{"at '/store/memory/maxKeys'", "minimum: got 10, want 1,000"}},
		{"cluster without addrs, no schema", []string{"store.type=cluster", "--skip-schema-validation"}, []string{"store.redis.addrs is required with store.type cluster"}},
		{"sentinel without addrs, no schema", []string{"store.type=sentinel", "--skip-schema-validation"}, []string{"store.redis.addrs is required with store.type sentinel"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "sluice", "helm/sluice"}
			for _, s := range tc.set {
				if strings.HasPrefix(s, "--") {
					args = append(args, s)
				} else {
					args = append(args, "--set", s)
				}
			}
			out, err := exec.Command(helm, args...).CombinedOutput()
			if err == nil {
				t.Fatalf("helm %s rendered, want a refusal naming %q", strings.Join(args, " "), tc.want)
			}
			for _, w := range tc.want {
				if !bytes.Contains(out, []byte(w)) {
					t.Errorf("helm %s: %v\n%s\nwant %q in it", strings.Join(args, " "), err, out, w)
				}
			}
		})
	}
}

// TestHelmChartNotes: what helm install prints names the HMAC Secret to
// create first, with its command, and warns when the embedded store runs
// on more than one replica (each limits alone: the limits multiply) or
// without any memory bound of its own.
func TestHelmChartNotes(t *testing.T) {
	helm := os.Getenv(helmEnv)
	if helm == "" {
		t.Skipf("%s is unset: make test's chart step sets it to a helm binary", helmEnv)
	}
	const (
		hmac     = `kubectl -n default create secret generic sluice-hmac --from-literal=k1="$(openssl rand -hex 32)"`
		replicas = "WARNING: store.type is memory and replicaCount is 2"
		unbound  = "WARNING: neither goMemLimit nor store.memory.maxKeys is set"
	)
	for _, tc := range []struct {
		name          string
		set           []string
		want, wantNot []string
	}{
		{"defaults", nil, []string{hmac, replicas}, []string{unbound}},
		{"one replica", []string{"replicaCount=1"}, []string{hmac}, []string{replicas, unbound}},
		{"redis", []string{"store.type=redis"}, []string{hmac}, []string{replicas, unbound}},
		{"no bound", []string{"replicaCount=1", "goMemLimit="}, []string{unbound}, []string{replicas}},
		{"tokens", []string{"auth.tokens[0].id=app", "auth.tokens[0].scopes={check}", "auth.tokens[0].secretName=sluice-tokens", "auth.tokens[1].id=ops", "auth.tokens[1].scopes={admin}", "auth.tokens[1].secretName=sluice-tokens"},
			[]string{hmac, `create secret generic sluice-tokens --from-literal=app="$(openssl rand -hex 32)" --from-literal=ops="$(openssl rand -hex 32)"`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"install", "sluice", "helm/sluice", "--dry-run=client", "--namespace", "default"}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := exec.Command(helm, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
			if !ok {
				t.Fatalf("helm %s printed no NOTES:\n%s", strings.Join(args, " "), out)
			}
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES lack %q:\n%s", w, notes)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(notes, w) {
					t.Errorf("NOTES say %q:\n%s", w, notes)
				}
			}
		})
	}
}

// checkRenderedNetworkPolicy checks that the NetworkPolicy selects the
// release's pods and admits ingress to the http port only from peers.
func checkRenderedNetworkPolicy(t *testing.T, np map[string]any) {
	t.Helper()
	var p struct {
		Spec struct {
			PodSelector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"podSelector"`
			PolicyTypes []string `json:"policyTypes"`
			Ingress     []struct {
				From  []map[string]any `json:"from"`
				Ports []struct {
					Port any `json:"port"`
				} `json:"ports"`
			} `json:"ingress"`
		} `json:"spec"`
	}
	b, _ := json.Marshal(np)
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.PodSelector.MatchLabels["app.kubernetes.io/instance"] != "sluice" || !contains(p.Spec.PolicyTypes, "Ingress") {
		t.Errorf("NetworkPolicy selects %v with types %v, want the release's pods, Ingress", p.Spec.PodSelector.MatchLabels, p.Spec.PolicyTypes)
	}
	if len(p.Spec.Ingress) != 1 || len(p.Spec.Ingress[0].From) == 0 || len(p.Spec.Ingress[0].Ports) == 0 || p.Spec.Ingress[0].Ports[0].Port != "http" {
		t.Errorf("NetworkPolicy ingress = %+v, want one rule from peers to the http port", p.Spec.Ingress)
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
func checkRenderedConfig(t *testing.T, cm, rulesCM map[string]any, store string) *config.Config {
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
		return cfg
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
	return cfg
}

// checkRenderedDeployment checks the probes, the image and the pod's
// settings.
func checkRenderedDeployment(t *testing.T, dep map[string]any) {
	t.Helper()
	var d struct {
		Spec struct {
			Template struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec struct {
					AutomountServiceAccountToken *bool `json:"automountServiceAccountToken"`
					TopologySpreadConstraints    []struct {
						TopologyKey   string `json:"topologyKey"`
						LabelSelector struct {
							MatchLabels map[string]string `json:"matchLabels"`
						} `json:"labelSelector"`
					} `json:"topologySpreadConstraints"`
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
	ps := d.Spec.Template.Spec
	if !ps.SecurityContext.RunAsNonRoot {
		t.Errorf("the pod may run as root")
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken = %v, want false: sluice never calls the Kubernetes API", ps.AutomountServiceAccountToken)
	}
	if len(ps.TopologySpreadConstraints) == 0 {
		t.Errorf("the pod has no topologySpreadConstraints, want the replicas spread over nodes")
	}
	for _, c := range ps.TopologySpreadConstraints {
		if len(c.LabelSelector.MatchLabels) == 0 || !reflect.DeepEqual(c.LabelSelector.MatchLabels, pick(d.Spec.Template.Metadata.Labels, c.LabelSelector.MatchLabels)) {
			t.Errorf("topology spread on %s selects %v, want the pod's own labels %v", c.TopologyKey, c.LabelSelector.MatchLabels, d.Spec.Template.Metadata.Labels)
		}
	}
}

// pick returns the entries of m under the keys of like.
func pick(m, like map[string]string) map[string]string {
	out := map[string]string{}
	for k := range like {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}

func keys(m map[string]map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
