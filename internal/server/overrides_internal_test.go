package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/subject"
)

// TestOverridesCap: past the store's bound (memstore.Options.MaxOverrides,
// which wiring sets) a PUT of a new override is refused with 409 and the
// bound named; changing one that exists, and removing one, still work.
func TestOverridesCap(t *testing.T) {
	ms, err := memstore.New(memstore.Options{MaxOverrides: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	lim, err := sluice.New(ms, []sluice.Policy{{ID: "api", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute}}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	admin := Token{ID: "ops", Secret: []byte("ops-secret-0123456789"), Scopes: []string{"admin"}}
	s, err := New(lim, subject.Unkeyed(), slog.New(slog.DiscardHandler), Options{Tokens: []Token{admin}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	do := func(method, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+"/v1/overrides", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+string(admin.Secret))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, step := range []struct {
		method, body string
		code         int
		want         string
	}{
		{"PUT", `{"policy":"api","subject":"a","limit":5}`, 200, ""},
		{"PUT", `{"policy":"api","subject":"b","limit":5}`, 200, ""},
		{"PUT", `{"policy":"api","subject":"c","limit":5}`, 409, "2 overrides are set: at most 2"},
		{"PUT", `{"policy":"api","subject":"b","limit":7}`, 200, ""},
		{"DELETE", `{"policy":"api","subject":"a"}`, 200, ""},
		{"PUT", `{"policy":"api","subject":"c","limit":5}`, 200, ""},
	} {
		if code, body := do(step.method, step.body); code != step.code || !strings.Contains(body, step.want) {
			t.Fatalf("%s %s = %d %s, want %d %q", step.method, step.body, code, body, step.code, step.want)
		}
	}
}
