package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice/internal/config"
)

const overridesBase = `policies:
  - id: api
    algorithm: fixed_window
    limit: 100
    window: 1m
  - id: upload
    algorithm: gcra
    limit: 10
    window: 1s
  - id: conc
    algorithm: concurrency
    limit: 4
    lease_ttl: 30s
overrides:
`

func TestParseOverrides(t *testing.T) {
	c, err := config.Parse(strings.NewReader(overridesBase + `  - policy: api
    subject: tenant-acme
    limit: 1000
    note: acme enterprise
  - policy: upload
    subject: tenant-acme
    limit: 50
    burst: 100
    window: 2s
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []config.Override{
		{Policy: "api", Subject: "tenant-acme", Limit: 1000, Note: "acme enterprise"},
		{Policy: "upload", Subject: "tenant-acme", Limit: 50, Burst: 100, Window: 2 * time.Second},
	}
	if diff := cmp.Diff(want, c.Overrides); diff != "" {
		t.Fatalf("Overrides (-want +got):\n%s", diff)
	}
	got := c.SluiceOverrides(func(s string) string { return "p:" + s })
	if got[0].Subject != "p:tenant-acme" || got[1].Burst != 100 {
		t.Fatalf("SluiceOverrides = %+v, want the subjects pseudonymized", got)
	}
}

// TestParseOverridesEveryError: each broken override is reported in one
// pass, with field, value, rule and line.
func TestParseOverridesEveryError(t *testing.T) {
	_, err := config.Parse(strings.NewReader(overridesBase + `  - policy: nope
    subject: a
    limit: 5
  - policy: api
    subject: b
    limit: 5
    burst: 9
  - policy: conc
    subject: c
    limit: 2
    window: 1s
  - policy: api
    limit: 5
  - policy: upload
    subject: d
    limit: 0
  - policy: api
    subject: e
    limit: 5
    window: 8761h
  - policy: api
    subject: b
    limit: 7
    colour: blue
`))
	want := []string{
		`overrides[0].policy: "nope": is not the id of any policy (line 15)`,
		`overrides[1].burst: 9: applies only to token_bucket and gcra; leave it unset for fixed_window (line 21)`,
		`overrides[2].window: "1s": does not apply to concurrency, which has no window (line 25)`,
		`overrides[3].subject: is required (line 26)`,
		`overrides[4].limit: 0: must be at least 1 (line 30)`,
		`overrides[5].window: "8761h": must be between 1ms and 365 days (8760h) (line 34)`,
		`overrides[6].colour: unknown key`,
	}
	if err == nil {
		t.Fatal("Parse = nil, want every override's error")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Parse error lacks %q; it is:\n%v", w, err)
		}
	}
}

// TestParseOverridesNameNoSubject: an override whose subject is refused
// is reported by field and line, never with the subject, which names a
// tenant (the error reaches serve's log).
func TestParseOverridesNameNoSubject(t *testing.T) {
	long := strings.Repeat("tenant-secret-9", 20)
	_, err := config.Parse(strings.NewReader(overridesBase + `  - { policy: api, subject: tenant-secret-9, limit: 5 }
  - { policy: api, subject: tenant-secret-9, limit: 6 }
  - { policy: api, subject: ` + long + `, limit: 7 }
`))
	for _, w := range []string{
		`overrides[1].subject: is already overridden for policy api by overrides[0] (line 16)`,
		`overrides[2].subject: is 300 bytes: must be 1 to 200 (line 17)`,
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Parse error lacks %q; it is:\n%v", w, err)
		}
	}
	if err != nil && strings.Contains(err.Error(), "tenant-secret-9") {
		t.Errorf("Parse error carries the subject:\n%v", err)
	}
}
