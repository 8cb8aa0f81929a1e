package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
	"github.com/sluicehq/sluice/sluiceclient"
)

// kindHTTP marks check API rows.
const kindHTTP kind = "check_api"

// runCheckAPI builds ../cmd/sluice, serves a generated config with the
// memory store and then with the redis store, and drives in every cell
// (the rows -rows matches): POST /v1/check over HTTP/1.1 keep-alive
// (rawDecide's client, or with -net-client net/http's); POST /v1/checks,
// 16 checks a request; the gRPC CheckStream on the listener that serves
// Envoy (64 callers a stream); sluiceclient, one request a check and
// coalescing; then the same policy through its rate-limiting reverse
// proxy, in front of an upstream of this process that answers every
// request, which is also measured alone (the floor). Each row's server
// CPU is the sluice serve process's, from /proc.
func runCheckAPI(ctx context.Context, cfg *config, e *env, redisAddr string, cells []cell, stderr io.Writer) ([]result, error) {
	alg, err := parseAlgorithm(cfg.httpAlgorithm)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	root, err := servetest.Root(ctx) // the main module, whose go.mod this module does not share
	if err != nil {
		return nil, err
	}
	bin, err := servetest.Build(ctx, root, dir, nil)
	if err != nil {
		return nil, err
	}
	up, err := startUpstream()
	if err != nil {
		return nil, err
	}
	defer up.Close()
	var rs []result
	if cfg.rls && cfg.onlyRLS {
		return runRLS(ctx, cfg, e, bin, dir, redisAddr, cells, stderr)
	}
	// each measures every cell through one way in: tag names it in the
	// progress lines, flush empties Redis before each cell, cpu reads the
	// server's CPU time (nil for none).
	checks := rawDecide
	if cfg.netClient {
		checks = httpDecide
	}
	eachN := func(limiter, tag string, batch int, decide func(c cell) (decideFunc, func()), flush bool, cpu func() float64) error {
		if !cfg.rows.MatchString(limiter) {
			return nil
		}
		for _, c := range cells {
			r := result{Limiter: limiter, Kind: kindHTTP, Callers: c.callers, Subjects: c.subjects, Mode: c.mode}
			if flush {
				if err := e.admin.FlushAll(ctx).Err(); err != nil {
					return err
				}
			}
			d, release := decide(c)
			err := measure(ctx, e, &r, d, batch, c, cfg.run, flush, cpu)
			release()
			if err != nil {
				return fmt.Errorf("%s, %s: %w", c, r.Limiter, err)
			}
			r.RoundTripsPerDecision = 0 // the server has its own client; the hook sees none of it
			fmt.Fprintf(stderr, "[%s] %s: %-45s %10.0f per second  p99 %7.0f µs  errors %d\n", tag, c, r.Limiter, r.PerSecond, r.P99US, r.Errors)
			rs = append(rs, r)
		}
		return nil
	}
	each := func(limiter, tag string, decide func(c cell) (decideFunc, func()), flush bool, cpu func() float64) error {
		return eachN(limiter, tag, 1, decide, flush, cpu)
	}
	err = each("upstream alone, no proxy (floor)", "proxy", func(c cell) (decideFunc, func()) {
		return proxyDecide(up.url, string(c.mode), e.subjects[:c.subjects], c.callers)
	}, false, nil)
	if err != nil {
		return nil, err
	}
	// The gRPC listener, for the CheckStream row, needs an Envoy rules
	// file: one domain no row asks.
	rules := filepath.Join(dir, "checkapi-rules", "bench.yaml")
	if err := os.MkdirAll(filepath.Dir(rules), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(rules, []byte(rlsRules(allowedMode)), 0o600); err != nil {
		return nil, err
	}
	for _, store := range []string{"memory", "redis"} {
		yaml := policiesYAML(alg) + proxyYAML(up.url) + fmt.Sprintf("envoy:\n  listen: \"127.0.0.1:0\"\n  configs: [%q]\n", rules)
		if store == "redis" {
			yaml += fmt.Sprintf("store:\n  type: redis\n  redis: { url: \"redis://%s/0\" }\n", redisAddr)
		}
		path := filepath.Join(dir, store+".yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			return nil, err
		}
		sv, err := startServe(ctx, bin, path)
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("sluice serve %s (%s)", alg, storeName(store))
		err = each(name+", POST /v1/check", "check API", func(c cell) (decideFunc, func()) {
			return checks(sv.url, string(c.mode), e.subjects[:c.subjects], c.callers)
		}, store == "redis", sv.cpu)
		if err == nil {
			err = eachN(name+", POST /v1/checks, 16 a request", "check API", checksPerRequest, func(c cell) (decideFunc, func()) {
				return batchDecide(sv.url, string(c.mode), e.subjects[:c.subjects], c.callers)
			}, store == "redis", sv.cpu)
		}
		if err == nil {
			err = each(name+", gRPC CheckStream", "check API", func(c cell) (decideFunc, func()) {
				return streamDecide(sv.envoy, string(c.mode), e.subjects[:c.subjects], c.callers)
			}, store == "redis", sv.cpu)
		}
		for _, off := range []bool{true, false} {
			if err == nil {
				err = each(name+", sluiceclient"+map[bool]string{true: ", one request a check", false: ", coalescing"}[off], "check API", func(c cell) (decideFunc, func()) {
					return clientDecide(sv.url, string(c.mode), e.subjects[:c.subjects], c.callers, off)
				}, store == "redis", sv.cpu)
			}
		}
		if err == nil && store == "redis" && strings.Contains(policiesYAML(alg), localPolicy) {
			err = each(name+", POST /v1/check, local quota", "check API", func(c cell) (decideFunc, func()) {
				return checks(sv.url, localPolicyOf(c.mode), e.subjects[:c.subjects], c.callers)
			}, true, sv.cpu)
		}
		if err == nil {
			err = each(name+", proxy", "proxy", func(c cell) (decideFunc, func()) {
				return proxyDecide(sv.proxy, string(c.mode), e.subjects[:c.subjects], c.callers)
			}, store == "redis", sv.cpu)
		}
		if err != nil {
			sv.stop()
			return nil, err
		}
		if err := sv.stop(); err != nil {
			return nil, err
		}
	}
	if cfg.rls {
		rr, err := runRLS(ctx, cfg, e, bin, dir, redisAddr, cells, stderr)
		if err != nil {
			return nil, fmt.Errorf("envoy rate-limit service: %w", err)
		}
		rs = append(rs, rr...)
	}
	return rs, nil
}

// localPolicy is the allowed mode's policy with local quota on: one hot
// subject through the check API with it, beside the same without
// (-subjects 1).
const localPolicy = "allowed_local"

// localPolicyOf is the policy of the local quota row in mode m: the
// allowed mode's local quota twin, and the denied mode's own policy (a
// limit of 1 an hour takes no blocks).
func localPolicyOf(m mode) string {
	if m == allowedMode {
		return localPolicy
	}
	return string(m)
}

func storeName(store string) string {
	if store == "redis" {
		return "redisstore"
	}
	return "memstore"
}

// policiesYAML returns a config with one policy per mode, named after
// the mode, with the limits the library cells use.
func policiesYAML(alg sluice.Algorithm) string {
	var b strings.Builder
	b.WriteString("server:\n  listen: \"127.0.0.1:0\"\npolicies:\n")
	for _, m := range []mode{allowedMode, deniedMode} {
		limit, window := limits(m, alg)
		fmt.Fprintf(&b, "  - id: %s\n    algorithm: %s\n    limit: %d\n    window: %s\n", m, alg, limit, window)
	}
	if alg == sluice.GCRA || alg == sluice.TokenBucket || alg == sluice.FixedWindow {
		limit, window := limits(allowedMode, alg)
		fmt.Fprintf(&b, "  - id: %s\n    algorithm: %s\n    limit: %d\n    window: %s\n    local_quota: true\n", localPolicy, alg, limit, window)
	}
	return b.String()
}

// proxyYAML returns the proxy section of the config: a route per mode,
// /<mode>, limited by the policy of that name, the subject taken from the
// request's X-Subject header.
func proxyYAML(upstream string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "proxy:\n  listen: \"127.0.0.1:0\"\n  upstream: %q\n  routes:\n", upstream)
	for _, m := range []mode{allowedMode, deniedMode} {
		fmt.Fprintf(&b, "    - match: { path_prefix: /%s }\n      policies: [%s]\n      subject: \"header:X-Subject\"\n", m, m)
	}
	return b.String()
}

// upstream is the HTTP server behind the proxy: it answers every request
// 200 with a short body.
type upstream struct {
	srv *http.Server
	url string
}

func startUpstream() (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok\n")
	}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return &upstream{srv: srv, url: "http://" + ln.Addr().String()}, nil
}

// Close stops the upstream.
func (u *upstream) Close() error { return u.srv.Close() }

// proxyDecide returns a decideFunc that sends GET /<policy> with the
// subject in X-Subject to base (the proxy, or the upstream alone).
func proxyDecide(base, policy string, subjects []string, callers int) (decideFunc, func()) {
	url := base + "/" + policy
	return keepAlive(callers, func(ctx context.Context, i int) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err == nil {
			req.Header.Set("X-Subject", subjects[i])
		}
		return req, err
	})
}

// httpDecide returns a decideFunc that asks the server's check API.
func httpDecide(base, policy string, subjects []string, callers int) (decideFunc, func()) {
	bodies := make([][]byte, len(subjects))
	for i, s := range subjects {
		bodies[i] = []byte(`{"policy":"` + policy + `","subject":"` + s + `"}`)
	}
	url := base + "/v1/check"
	return keepAlive(callers, func(ctx context.Context, i int) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[i]))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
		return req, err
	})
}

// keepAlive returns a decideFunc that sends the request build makes for
// subject i over a keep-alive transport with a connection per caller: 200
// is an admission, 429 a denial, anything else an error.
func keepAlive(callers int, build func(ctx context.Context, i int) (*http.Request, error)) (decideFunc, func()) {
	tr := &http.Transport{MaxIdleConns: callers + 16, MaxIdleConnsPerHost: callers + 16, IdleConnTimeout: time.Minute, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return func(ctx context.Context, i int) (int, error) {
		req, err := build(ctx, i)
		if err != nil {
			return 0, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return 1, nil
		case http.StatusTooManyRequests:
			return 0, nil
		}
		return 0, fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}, tr.CloseIdleConnections
}

// served is a process this run started: sluice serve (proc), or a peer
// (cmd).
type served struct {
	proc  *servetest.Process
	cmd   *exec.Cmd
	url   string // the check API
	proxy string // the proxy, when the config has one
	envoy string // the Envoy rate-limit service (host:port), when the config has one
}

// startServe runs bin serve -c path (servetest) and waits (at most 30 s)
// for the line that names its address.
func startServe(ctx context.Context, bin, path string) (*served, error) {
	p, err := servetest.Start(bin, servetest.Options{Timeout: 30 * time.Second}, "serve", "-c", path)
	if err != nil {
		return nil, err
	}
	return &served{proc: p, url: p.URL, proxy: p.ProxyURL(), envoy: p.RLSAddr()}, nil
}

// pid is the process's id.
func (s *served) pid() int {
	if s.proc != nil {
		return s.proc.PID()
	}
	return s.cmd.Process.Pid
}

// stop sends SIGTERM to the process this run started and waits for it,
// at most 15 s before SIGKILL.
func (s *served) stop() error {
	if s.proc != nil {
		return s.proc.Stop(15 * time.Second)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		<-done
		return errors.New("process did not stop within 15s of SIGTERM; killed")
	}
}

// cpu returns the server process's user + system CPU time in µs, read
// from /proc (clock ticks of 10 ms); 0 where /proc is missing.
func (s *served) cpu() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid()))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, state
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) * 1e4
}

// parseAlgorithm maps an algorithm's config spelling to the Algorithm.
func parseAlgorithm(s string) (sluice.Algorithm, error) {
	for a := sluice.FixedWindow; a <= sluice.Concurrency; a++ {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q", s)
}

// checksPerRequest is how many checks a POST /v1/checks row sends in
// each request.
const checksPerRequest = 16

// batchDecide returns a decideFunc that asks POST /v1/checks for
// checksPerRequest subjects from i on: the allowed ones are counted,
// a status other than 200 or 429 in a result is an error.
func batchDecide(base, policy string, subjects []string, callers int) (decideFunc, func()) {
	url := base + "/v1/checks"
	tr := &http.Transport{MaxIdleConns: callers + 16, MaxIdleConnsPerHost: callers + 16, IdleConnTimeout: time.Minute, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return func(ctx context.Context, i int) (int, error) {
		var body bytes.Buffer
		body.WriteString(`{"checks":[`)
		for k := range checksPerRequest {
			if k > 0 {
				body.WriteByte(',')
			}
			body.WriteString(`{"policy":"` + policy + `","subject":"` + subjects[(i+k)%len(subjects)] + `"}`)
		}
		body.WriteString(`]}`)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &body)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var a struct {
			Results []struct {
				Status int `json:"status"`
			} `json:"results"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusOK || len(a.Results) != checksPerRequest {
			return 0, fmt.Errorf("POST /v1/checks: %s, %d results (%v)", resp.Status, len(a.Results), err)
		}
		allowed := 0
		for _, r := range a.Results {
			switch r.Status {
			case http.StatusOK:
				allowed++
			case http.StatusTooManyRequests:
			default:
				return 0, fmt.Errorf("POST /v1/checks: a result of %d", r.Status)
			}
		}
		return allowed, nil
	}, tr.CloseIdleConnections
}

// clientDecide returns a decideFunc that asks through sluiceclient, its
// checks coalesced or (off) one request each.
func clientDecide(base, policy string, subjects []string, callers int, off bool) (decideFunc, func()) {
	tr := &http.Transport{MaxIdleConns: callers + 16, MaxIdleConnsPerHost: callers + 16, IdleConnTimeout: time.Minute, DisableCompression: true}
	c, err := sluiceclient.New(base, sluiceclient.Options{NoCoalescing: off, Retries: -1, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		return func(context.Context, int) (int, error) { return 0, err }, func() {}
	}
	return func(ctx context.Context, i int) (int, error) {
		o := c.Check(ctx, sluice.Request{Policy: policy, Subject: subjects[i]})
		switch o.Kind {
		case sluice.Allowed:
			return 1, nil
		case sluice.Denied:
			return 0, nil
		}
		return 0, fmt.Errorf("sluiceclient: %v: %w", o.Kind, o.Err)
	}, tr.CloseIdleConnections
}
