package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/config"
)

// TestListenersNameTheDefault: a config without a server section serves
// the check API on config.DefaultListen, and /v1/config says it is the
// default rather than leaving the address out.
func TestListenersNameTheDefault(t *testing.T) {
	for _, tc := range []struct {
		yaml, want string
	}{
		{"policies:\n  - { id: a, algorithm: gcra, limit: 1, window: 1s }\n", "[{check_api 127.0.0.1:8080 default}]"},
		{"server: { decision_timeout: 1s }\npolicies:\n  - { id: a, algorithm: gcra, limit: 1, window: 1s }\n", "[{check_api 127.0.0.1:8080 default}]"},
		{"server: { listen: \"127.0.0.1:9\" }\nenvoy: { listen: \"127.0.0.1:10\", configs: [x.yaml] }\n", "[{check_api 127.0.0.1:9 server.listen} {envoy 127.0.0.1:10 envoy.listen}]"},
	} {
		cfg, err := config.Parse(strings.NewReader(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(listeners(cfg)); got != tc.want {
			t.Errorf("listeners of %q = %s, want %s", tc.yaml, got, tc.want)
		}
	}
	if got := fmt.Sprint(listeners(config.Default())); got != "[{check_api 127.0.0.1:8080 default}]" {
		t.Errorf("listeners of the built-in example = %s, want the default", got)
	}
}
