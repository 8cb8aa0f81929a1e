package server

import (
	_ "embed"
	"net/http"
)

// openAPIPath serves the HTTP API's OpenAPI 3.1 document, openapi.yaml:
// the contract a client in any language is generated from (see
// docs/http-api.md). It needs no token, as /healthz does not. The
// server's tests validate every exchange they make against it
// (openapi_test.go), so it cannot drift from the handlers.
const openAPIPath = "/openapi.yaml"

//go:embed openapi.yaml
var openAPIDoc []byte

// serveOpenAPI answers GET /openapi.yaml.
func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/yaml")
	h.Set("Cache-Control", "no-cache")
	w.Write(openAPIDoc)
}
