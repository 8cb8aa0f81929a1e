package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func (a *app) check(ctx context.Context, args []string) error {
	fs := newFlagSet("check")
	var (
		base, policy, subj, evalID, tokenEnv, caFile, lease string
		cost                                                int64
		refund, reset                                       bool
		timeout                                             time.Duration
	)
	fs.StringVar(&base, "url", "http://127.0.0.1:8080", "the server's base `URL`")
	fs.StringVar(&policy, "policy", "", "the policy `ID` to check; several, comma-separated, are checked together (required)")
	fs.StringVar(&subj, "subject", "", "whose budget to spend (required); the server pseudonymizes it")
	fs.Int64Var(&cost, "cost", 1, "units to spend; 0 peeks without spending")
	fs.BoolVar(&refund, "refund", false, "give --cost units back instead of spending them")
	fs.BoolVar(&reset, "reset", false, "clear the subject's state of the policies (unlock it); takes no --cost")
	fs.StringVar(&evalID, "evaluation-id", "", "identifies the request across retries")
	fs.StringVar(&lease, "release", "", "give back the lease `ID` a check of a concurrency policy answered (POST /v1/release)")
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "give up after this long")
	fs.StringVar(&tokenEnv, "token-env", "", "send the bearer token held by the environment variable `NAME` (the server's server.auth)")
	fs.StringVar(&caFile, "ca-file", "", "trust the PEM certificates in `FILE` for an https:// URL, besides the system's")
	if err := a.parseFlags(fs, checkSynopsis, args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return &exitError{code: 2, err: err}
	}
	if policy == "" || subj == "" {
		return &exitError{code: 2, err: &usageError{msg: "check needs --policy and --subject", usage: usage}}
	}
	body := struct {
		Policy       string   `json:"policy,omitempty"`
		Policies     []string `json:"policies,omitempty"`
		Subject      string   `json:"subject"`
		Cost         *int64   `json:"cost,omitempty"`
		Refund       bool     `json:"refund,omitempty"`
		Reset        bool     `json:"reset,omitempty"`
		EvaluationID string   `json:"evaluation_id,omitempty"`
		LeaseID      string   `json:"lease_id,omitempty"`
	}{Subject: subj, Refund: refund, Reset: reset, EvaluationID: evalID, LeaseID: lease}
	if ids := strings.Split(policy, ","); len(ids) > 1 {
		body.Policies = ids
	} else {
		body.Policy = policy
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "cost" {
			body.Cost = &cost
		}
	})
	data, err := json.Marshal(body)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: %w", err)}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1/check")
	if lease != "" {
		url += "/v1/release"
	} else {
		url += "/v1/check"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	if tokenEnv != "" {
		token := a.getenv(tokenEnv)
		if token == "" {
			return &exitError{code: 2, err: fmt.Errorf("check: --token-env: environment variable %s is not set or empty", tokenEnv)}
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := http.DefaultClient
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return &exitError{code: 2, err: fmt.Errorf("check: --ca-file: %w", err)}
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return &exitError{code: 2, err: fmt.Errorf("check: --ca-file %s: no PEM certificate in it", caFile)}
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		client = &http.Client{Transport: t}
	}
	resp, err := client.Do(req)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: %w", err)}
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: read answer: %w", err)}
	}
	a.stdout.Write(answer)
	if len(answer) > 0 && answer[len(answer)-1] != '\n' {
		io.WriteString(a.stdout, "\n")
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusTooManyRequests:
		return &exitError{code: 1}
	}
	return &exitError{code: 2, err: fmt.Errorf("check: %s", resp.Status)}
}
