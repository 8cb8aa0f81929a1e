package server_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestServeLoadsWarnings: a rules file envoyproxy/ratelimit loads, with a
// wildcard the one above it covers, is served (the first listed wins);
// the warning is logged once and counted in sluice_config_warnings.
func TestServeLoadsWarnings(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sluice.yaml": envoyConfig(""), "rules/shop.yaml": `domain: shop
descriptors:
  - { key: path, value: "ab*", rate_limit: { unit: hour, requests_per_unit: 5 } }
  - { key: path, value: "abc*", rate_limit: { unit: hour, requests_per_unit: 9 } }
`})
	s := startRun(t, filepath.Join(dir, "sluice.yaml"), "")
	if got := metricValue(t, s, "sluice_config_warnings"); got != "1" {
		t.Errorf("sluice_config_warnings = %q, want 1", got)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
	if n := strings.Count(s.logs.String(), `can never match: the wildcard \"ab*\" above it`); n != 1 {
		t.Errorf("serve logged the warning %d times, want once:\n%s", n, s.logs)
	}
}
