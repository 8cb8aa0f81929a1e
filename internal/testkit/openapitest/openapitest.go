// Package openapitest holds sluice serve's HTTP exchanges to the API's
// OpenAPI 3.1 document, internal/server/openapi.yaml, with a validator
// library (kin-openapi's openapi3filter, which validates a 3.1
// document's schemas as JSON Schema 2020-12), so the document cannot
// drift from the server. Handler wraps a test server's handler, Client
// is a client for a server a test does not build itself (a server.Run,
// a sluice serve process); both fail the test on any mismatch.
package openapitest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// File is the document's path in the module.
const File = "internal/server/openapi.yaml"

// Path finds File from the working directory (a test's: its package's
// directory) or one of its parents.
func Path() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for range 8 { // bounded: no package is deeper
		p := filepath.Join(dir, File)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		dir = filepath.Dir(dir)
	}
	return "", errors.New("openapitest: " + File + " not found above the working directory")
}

var router = sync.OnceValues(func() (routers.Router, error) {
	path, err := Path()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(path)
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
	doc.Servers = nil // match any host: tests' servers listen on free ports
	return gorillamux.NewRouter(doc)
})

// Router returns the document's router, failing t when the document
// does not load or is not a valid OpenAPI document.
func Router(t testing.TB) routers.Router {
	t.Helper()
	r, err := router()
	if err != nil {
		t.Fatalf("%s: %v", File, err)
	}
	return r
}

// Handler returns h, validating each exchange on a path the document
// describes (see Check). Paths it does not describe (/ui, /metrics,
// unknown ones) go to h unchecked.
func Handler(t testing.TB, h http.Handler) http.Handler {
	rt := Router(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := rt.FindRoute(r); err != nil {
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
		Check(t, sent, body, rec.Code, rec.Header(), rec.Body.Bytes())
	})
}

// Client returns a client validating each exchange it makes on a path
// the document describes (see Check).
func Client(t testing.TB) *http.Client {
	return &http.Client{Transport: transport{t: t, router: Router(t)}}
}

type transport struct {
	t      testing.TB
	router routers.Router
}

func (v transport) RoundTrip(r *http.Request) (*http.Response, error) {
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
	Check(v.t, sent, body, resp.StatusCode, resp.Header, got)
	return resp, nil
}

// Check validates one exchange, r with body answered code, header and
// answer, against the document: a request it allows must be answered as
// it says, and one it forbids must be refused (4xx) with an answer it
// describes. A mismatch fails t; a path the document does not describe
// is not checked.
func Check(t testing.TB, r *http.Request, body []byte, code int, header http.Header, answer []byte) {
	route, params, err := Router(t).FindRoute(r)
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
		t.Errorf("%s %s %s: the server answered %d to a request %s forbids: %v", r.Method, r.URL.Path, body, code, File, err)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: code, Header: header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	out.SetBodyBytes(answer)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		t.Errorf("%s %s %s: the answer does not match %s: %v\nanswer: %d %v %s", r.Method, r.URL.Path, body, File, err, code, header, answer)
	}
}
