package server_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/testkit/openapitest"
)

// The HTTP API's contract, openapi.yaml, is held to the server by
// openapitest: every fixture's handler is wrapped in validating, and the
// tests of a whole server.Run ask through openAPIClient, so each request
// a test sends and each answer the server gives is checked against the
// document, and a test fails on any mismatch.

func validating(t testing.TB, h http.Handler) http.Handler { return openapitest.Handler(t, h) }

func openAPIClient(t testing.TB) *http.Client { return openapitest.Client(t) }

// TestOpenAPIServed: GET /openapi.yaml answers the document, without a
// token on a server that requires one, and it is a valid OpenAPI 3.1
// document.
func TestOpenAPIServed(t *testing.T) {
	openapitest.Router(t)
	want, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, demoPolicies, server.Options{Tokens: []server.Token{appToken, opsToken}})
	resp, err := http.Get(f.url + "/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(got, want) {
		t.Errorf("GET /openapi.yaml = %d %s, %d bytes, want 200 application/yaml and the %d bytes of openapi.yaml", resp.StatusCode, resp.Header.Get("Content-Type"), len(got), len(want))
	}
}
