package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/server"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// The HTTP API's contract, openapi.yaml, is held to the server by a
// validator library (kin-openapi's openapi3filter, which validates
// OpenAPI 3.1 documents' schemas as JSON Schema 2020-12): every fixture's
// handler is wrapped in validating, so each request a test sends and each
// answer the server gives is checked against the document, and a test
// fails on any mismatch.

// openAPIFile is the document, read from the package directory: the
// bytes the server embeds.
const openAPIFile = "openapi.yaml"

var openAPIRouter = sync.OnceValues(func() (routers.Router, error) {
	raw, err := os.ReadFile(openAPIFile)
	if err != nil {
		return nil, err
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, err
	}
	doc.Servers = nil // match any host: the tests' servers listen on free ports
	return gorillamux.NewRouter(doc)
})

// validating returns h, validating each exchange (see checkExchange).
// Paths the document does not describe (/ui, /metrics, unknown ones) go
// to h unchecked.
func validating(t testing.TB, h http.Handler) http.Handler {
	router := mustOpenAPIRouter(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := router.FindRoute(r); err != nil {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sent := r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
		checkExchange(t, router, sent, body, rec.Code, rec.Header(), rec.Body.Bytes())
	})
}

// openAPIClient returns a client validating each exchange it makes with
// a server on a path the document describes (see checkExchange): for
// the tests of a whole server.Run, whose handler is not theirs to wrap.
func openAPIClient(t testing.TB) *http.Client {
	return &http.Client{Transport: validatingTransport{t: t, router: mustOpenAPIRouter(t)}}
}

type validatingTransport struct {
	t      testing.TB
	router routers.Router
}

func (v validatingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if _, _, err := v.router.FindRoute(r); err != nil {
		return http.DefaultTransport.RoundTrip(r)
	}
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return nil, err
		}
		r.Body.Close()
	}
	sent := r.Clone(r.Context())
	r = r.Clone(r.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(got))
	checkExchange(v.t, v.router, sent, body, resp.StatusCode, resp.Header, got)
	return resp, nil
}

func mustOpenAPIRouter(t testing.TB) routers.Router {
	router, err := openAPIRouter()
	if err != nil {
		t.Fatalf("%s: %v", openAPIFile, err)
	}
	return router
}

// checkExchange validates one exchange against the document: a request
// it allows must be answered as it says, and one it forbids must be
// refused (4xx) with an answer it describes. A mismatch fails t.
func checkExchange(t testing.TB, router routers.Router, r *http.Request, body []byte, code int, header http.Header, answer []byte) {
	route, params, err := router.FindRoute(r)
	if err != nil {
		return
	}
	ctx := context.Background()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if len(body) > 0 && r.Header.Get("Content-Type") == "" {
		// The server reads a body as JSON whatever its Content-Type (the
		// document says so): judge it as JSON.
		r.Header.Set("Content-Type", "application/json")
	}
	in := &openapi3filter.RequestValidationInput{
		Request: r, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
	}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && code < 400 {
		t.Errorf("%s %s %s: the server answered %d to a request %s forbids: %v", r.Method, r.URL.Path, body, code, openAPIFile, err)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: code, Header: header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	out.SetBodyBytes(answer)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		t.Errorf("%s %s %s: the answer does not match %s: %v\nanswer: %d %v %s", r.Method, r.URL.Path, body, openAPIFile, err, code, header, answer)
	}
}

// TestOpenAPIServed: GET /openapi.yaml answers the document, without a
// token on a server that requires one, and it is a valid OpenAPI 3.1
// document.
func TestOpenAPIServed(t *testing.T) {
	mustOpenAPIRouter(t)
	want, err := os.ReadFile(openAPIFile)
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
		t.Errorf("GET /openapi.yaml = %d %s, %d bytes, want 200 application/yaml and the %d bytes of %s", resp.StatusCode, resp.Header.Get("Content-Type"), len(got), len(want), openAPIFile)
	}
}
