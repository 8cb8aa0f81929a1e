package wiring

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
)

// HTTPClient returns the client a command asks a server with: the
// default one, or with caFile one that also trusts the PEM certificates
// in that file (for an https:// URL signed by a private CA). Its errors
// name the flag, --ca-file.
func HTTPClient(caFile string) (*http.Client, error) {
	if caFile == "" {
		return http.DefaultClient, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", caFile)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: t}, nil
}

// Token returns the bearer token a command sends a server: the value of
// the environment variable env, read with getenv, when env is named
// (--token-env; an unset or empty one is an error), else token.
func Token(getenv func(string) string, env, token string) (string, error) {
	if env == "" {
		return token, nil
	}
	if token = getenv(env); token == "" {
		return "", fmt.Errorf("--token-env %s: the environment variable is unset or empty", env)
	}
	return token, nil
}

// Send sends body as JSON (none when nil) to url with method, with the
// bearer token when not empty, over client: a command's request to a
// server's API.
func Send(ctx context.Context, client *http.Client, method, url string, body any, token string) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return client.Do(req)
}
