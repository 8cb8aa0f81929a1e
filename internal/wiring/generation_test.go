package wiring_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/wiring"
	"github.com/sluicehq/sluice/memstore"
)

const buildRules = `domain: shop
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 600, failure_mode: open }
`

// buildFrom parses cfgYAML (and rulesYAML, unless "") and builds their
// generation on a memstore.
func buildFrom(t *testing.T, cfgYAML, rulesYAML string) (*wiring.Generation, *config.Config) {
	t.Helper()
	cfg, err := config.Parse(strings.NewReader(cfgYAML))
	if err != nil {
		t.Fatalf("config.Parse: %v", err)
	}
	var rs *rules.Config
	if rulesYAML != "" {
		if rs, err = rules.Parse([]rules.Source{{Name: "shop.yaml", Data: []byte(rulesYAML)}}); err != nil {
			t.Fatalf("rules.Parse: %v", err)
		}
	}
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	g, err := wiring.Build(cfg, rs, wiring.BuildOptions{Store: ms})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return g, cfg
}

// TestBuild takes a decision on what one config's generation holds: the
// config's Limiter with its overrides, the rules files' Limiter with
// local quota as envoy.local_quota says, every failure mode, and edge
// cores deciding with those Limiters.
func TestBuild(t *testing.T) {
	g, cfg := buildFrom(t, `
policies:
  - { id: api, algorithm: fixed_window, limit: 10, window: 1m, failure_mode: local }
overrides:
  - { policy: api, subject: alice, limit: 20 }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
  local_quota: true
`, buildRules)
	if _, ok := g.Limiter.Policy("api"); !ok {
		t.Fatal("the config's Limiter lacks its policy api")
	}
	if _, ok := g.Limiter.Policy("shop.user"); ok {
		t.Error("the config's Limiter holds the rules' policy shop.user: it belongs to Envoy's alone")
	}
	envoyID := g.RLS.Rules.Policies()[0].ID
	if ids := wiring.PolicyIDs(cfg, g.RLS.Rules); len(ids) != 2 || ids[0] != "api" || ids[1] != envoyID {
		t.Errorf("PolicyIDs = %v, want [api %s]: the config's, then the rules files'", ids, envoyID)
	}
	p, ok := g.Envoy.Policy(envoyID)
	if !ok || !p.LocalQuota.Enabled {
		t.Errorf("Envoy's policy %q: found %v, local quota %v; want found, on (envoy.local_quota: true)", envoyID, ok, p.LocalQuota.Enabled)
	}
	if len(g.Overrides) != 1 || g.Overrides[0].Subject == "alice" {
		t.Errorf("Overrides = %+v, want alice's, pseudonymized", g.Overrides)
	}
	if g.FailureModes["api"] != failure.Local || g.FailureModes[envoyID] != failure.Open {
		t.Errorf("FailureModes = %v, want api local and %s open", g.FailureModes, envoyID)
	}
	if g.Core.Limiter() != g.Limiter || g.RLS.Core.Limiter() != g.Envoy || g.RLS.Limiter != g.Envoy {
		t.Error("an edge core decides with another Limiter than its generation's")
	}
}

// TestBuildEnvoyOnly: a config with an envoy section and no policies
// answers its check API for the rules files' policies.
func TestBuildEnvoyOnly(t *testing.T) {
	g, _ := buildFrom(t, "envoy:\n  listen: \"127.0.0.1:0\"\n  configs: [\"rules/*.yaml\"]\n", buildRules)
	if g.Limiter == nil || g.Limiter != g.Envoy || g.Core.Limiter() != g.Envoy {
		t.Fatalf("Limiter = %p, Envoy = %p: want the rules files' Limiter for both", g.Limiter, g.Envoy)
	}
	g, _ = buildFrom(t, "policies:\n  - { id: api, algorithm: fixed_window, limit: 10, window: 1m }\n", "")
	if g.Envoy != nil || g.RLS != nil {
		t.Errorf("without an envoy section: Envoy = %p, RLS = %p, want nil", g.Envoy, g.RLS)
	}
}

// TestBuildLocalQuotaPerRule: a rule's own sluice_local_quota (on, off or
// its numbers) overrides envoy.local_quota, which still decides for the
// rules that do not write it; an override of a rule with its own local
// quota is judged as the Limiter takes it (local quota's defaults for
// the subject's numbers).
func TestBuildLocalQuotaPerRule(t *testing.T) {
	const rulesYAML = `domain: shop
descriptors:
  - key: tenant
    rate_limit: { unit: second, requests_per_unit: 10000, sluice_local_quota: { block_time: 400ms, max_block: 500 } }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 600, sluice_local_quota: false }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 600 }
`
	for _, wide := range []bool{false, true} {
		g, _ := buildFrom(t, fmt.Sprintf(`
overrides:
  - { envoy: { domain: shop, entries: [{ key: tenant, value: big }] }, limit: 100000, window: 100ms }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
  local_quota: %v
`, wide), rulesYAML)
		for id, want := range map[string]sluice.LocalQuota{
			"shop.tenant": {Enabled: true, BlockTime: 400 * time.Millisecond, MaxBlock: 500},
			"shop.user":   {},
			"shop.path":   {Enabled: wide, BlockTime: 100 * time.Millisecond, MaxBlock: 60},
		} {
			if !wide && id == "shop.path" {
				want = sluice.LocalQuota{}
			}
			if p, ok := g.Envoy.Policy(id); !ok || p.LocalQuota != want {
				t.Errorf("envoy.local_quota %v: Envoy's policy %q: found %v, local quota %+v; want %+v", wide, id, ok, p.LocalQuota, want)
			}
		}
	}
}
