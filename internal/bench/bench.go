package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/evaluation"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/wiring"
)

// Load is one run of sluice bench: a load generator users point at
// their own store and policy (the embedded store, a Redis or Redis
// Cluster) or at a running sluice serve.
type Load struct {
	// URL, when set, is the base URL of a sluice serve whose POST
	// /v1/check is driven with Policy.ID; Store is then unused.
	URL string
	// TokenEnv, with URL, names the environment variable (read with
	// Getenv) holding a token sent as "Authorization: Bearer <token>" (a
	// server with server.auth.tokens). Default: none.
	TokenEnv string
	// CAFile, with an https URL, is a PEM file of the certificates that
	// sign the server's (a private CA's). Default: the system's roots.
	CAFile string
	// Store is the store to drive through the library with Policy.
	Store config.Store
	// Getenv reads the Redis password's variable and TokenEnv.
	Getenv func(string) string
	// Clock is the memory store's.
	Clock sluice.Clock
	// Policy is what every decision asks (only its ID with URL).
	Policy sluice.Policy
	// Mode is what the report calls the run (allowed, denied, mixed,
	// custom, server). In mode "mixed" every other subject is checked
	// against a second policy, Policy.ID + "-denied", limit 1 per hour.
	Mode string
	// Subjects is how many distinct subjects the callers pick from at
	// random, Callers how many decide at once, Duration for how long.
	Subjects, Callers int
	Duration          time.Duration
	// Progress receives a line that says what the run measures when the
	// load starts, then a progress bar (a terminal) or a line every few
	// seconds.
	Progress io.Writer
}

// The modes of sluice bench: what share of its decisions its policy
// allows. Explicit numbers make the mode Custom; a server's policy
// is Server.
const (
	Allowed = "allowed" // limit 1e9 per second: nearly every decision allowed
	Denied  = "denied"  // limit 1 per hour: every decision after a subject's first denied
	Mixed   = "mixed"   // half the subjects on each of the two: about half allowed
	Custom  = "custom"
	Server  = "server"
)

// Numbers returns the limit and window of mode's policy for
// algorithm (its config spelling): Denied 1 per hour, the others
// (Mixed's allowing half) the most the algorithm takes per second
// (sliding_log keeps an entry per unit).
func Numbers(mode, algorithm string) (int64, time.Duration) {
	switch {
	case mode == Denied:
		return 1, time.Hour
	case algorithm == sluice.SlidingLog.String():
		return 100_000, time.Second
	}
	return 1_000_000_000, time.Second
}

// header is the line a run starts with: what it measures.
func (b *Load) header() string {
	p := b.Policy
	what := map[string]string{
		Allowed: fmt.Sprintf("nearly every decision is allowed (%s, limit %d per 1s); --mode denied or mixed measures denials", p.Algorithm, p.Limit),
		Denied:  fmt.Sprintf("every decision after a subject's first is denied (%s, limit 1 per 1h); --mode allowed or mixed for admissions", p.Algorithm),
		Mixed:   fmt.Sprintf("about half the decisions are allowed: half the subjects on %s limit %d per 1s, half on limit 1 per 1h (policy %s-denied)", p.Algorithm, p.Limit, p.ID),
		Custom:  fmt.Sprintf("the policy given: %s, limit %d per %s", p.Algorithm, p.Limit, p.Window),
		Server:  fmt.Sprintf("policy %q as the server at %s configures it", p.ID, b.URL),
	}[b.Mode]
	return fmt.Sprintf("sluice bench: mode %s: %s; %d callers, %d subjects, %s", b.Mode, what, b.Callers, b.Subjects, b.Duration)
}

// Run runs b and returns its summary. Against Redis, the run's keys live
// under a prefix of their own, deleted at the end (a failure to delete
// is reported on b.Progress). An error means no run took place.
func (b *Load) Run(ctx context.Context) (*Report, error) {
	runID := newRunID()
	// Subjects carry the run id, so two runs never share state.
	subjects := make([]string, b.Subjects)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("bench-%s-%d", runID, i)
	}
	rep := &Report{Policy: b.Policy.ID, Mode: b.Mode, Callers: b.Callers, Subjects: b.Subjects}
	var decide benchDecider
	var cleanup func(context.Context) (int64, error)
	if b.URL != "" {
		rep.Target = b.URL
		token, err := wiring.Token(b.Getenv, b.TokenEnv, "")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		d, closeIdle, err := httpDecider(b.URL, token, b.CAFile, b.Policy.ID, subjects, b.Callers)
		if err != nil {
			return nil, err
		}
		defer closeIdle()
		decide = d
	} else {
		d, clean, closeStore, err := b.storeDecider(runID, subjects, rep)
		if err != nil {
			return nil, err
		}
		defer closeStore()
		decide, cleanup = d, clean
	}
	fmt.Fprintln(b.Progress, b.header())
	res := benchLoad(ctx, b.Progress, decide, subjects, b.Callers, b.Duration)
	if cleanup != nil {
		// Leave nothing behind on the user's Redis, even after Ctrl-C.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		n, err := cleanup(cctx)
		cancel()
		rep.KeysDeleted = n
		if err != nil {
			fmt.Fprintf(b.Progress, "sluice bench: deleting the run's keys (prefix sluice-bench:%s:): %v\n", runID, err)
		}
	}
	res.fill(rep)
	return rep, nil
}

// TooManyErrors returns why r failed a run that allows maxErrors (0 to
// 1) of its answers to be errors rather than decisions, naming the first;
// nil when it did not.
func (r *Report) TooManyErrors(maxErrors float64) error {
	answers := r.Decisions + r.Other
	if answers == 0 || float64(r.Other) <= maxErrors*float64(answers) {
		return nil
	}
	stopped := ""
	if r.StoppedEarly {
		stopped = " (stopped early: every answer was an error)"
	}
	return fmt.Errorf("bench: %d of %d answers (%.1f%%) were errors, more than --max-errors %g%s; the first: %s", r.Other, answers, 100*float64(r.Other)/float64(answers), maxErrors, stopped, r.FirstError)
}

// storeDecider decides through the library over b's store with b's
// policy, which it describes in rep. cleanup, when not nil, deletes the
// run's keys; closeStore releases the store.
func (b *Load) storeDecider(runID string, subjects []string, rep *Report) (decide benchDecider, cleanup func(context.Context) (int64, error), closeStore func(), err error) {
	p := evaluation.Defaults(b.Policy)
	rep.Target, rep.Algorithm, rep.Window = b.Store.Type, p.Algorithm.String(), p.Window.String()
	rep.Limit, rep.Burst = p.Limit, p.Burst
	prefix := "sluice-bench:" + runID + ":"
	st, err := wiring.NewStore(b.Store, wiring.StoreOptions{Clock: b.Clock, Getenv: b.Getenv, Prefix: prefix})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("bench: %w", err)
	}
	closeStore = func() { st.Close() }
	if st.Ready != nil {
		if err := waitReady(st.Ready, benchReadyWait); err != nil {
			closeStore()
			return nil, nil, nil, fmt.Errorf("bench: %w", err)
		}
	}
	if st.Client != nil {
		cleanup = func(ctx context.Context) (int64, error) { return deletePrefix(ctx, st.Client, prefix) }
	}
	policies := []sluice.Policy{b.Policy}
	policyOf := map[string]string{}
	if b.Mode == Mixed {
		denying := sluice.Policy{ID: b.Policy.ID + "-denied", Algorithm: p.Algorithm, Limit: 1, Window: time.Hour}
		policies = append(policies, denying)
		for i, s := range subjects {
			if i%2 == 1 {
				policyOf[s] = denying.ID
			}
		}
	}
	lim, err := sluice.New(st.Store, policies, sluice.Options{})
	if err != nil {
		closeStore()
		return nil, nil, nil, fmt.Errorf("bench: %w", err)
	}
	decide = func(ctx context.Context, subject string) (sluice.Kind, error) {
		id := b.Policy.ID
		if other, ok := policyOf[subject]; ok {
			id = other
		}
		o := lim.Check(ctx, sluice.Request{Policy: id, Subject: subject})
		return o.Kind, o.Err
	}
	return decide, cleanup, closeStore, nil
}

// Report is the summary sluice bench prints; --json prints it as is.
type Report struct {
	Target    string  `json:"target"` // "memory", "redis" or the server's URL
	Mode      string  `json:"mode"`   // allowed, denied, mixed; custom with explicit numbers; server with --url
	Policy    string  `json:"policy"`
	Algorithm string  `json:"algorithm,omitempty"`
	Limit     int64   `json:"limit,omitempty"`
	Window    string  `json:"window,omitempty"`
	Burst     int64   `json:"burst,omitempty"`
	Callers   int     `json:"callers"`
	Subjects  int     `json:"subjects"`
	Seconds   float64 `json:"seconds"`
	Decisions int64   `json:"decisions"`
	PerSecond float64 `json:"decisions_per_second"`
	Allowed   int64   `json:"allowed"`
	Denied    int64   `json:"denied"`
	// Other counts requests that got no decision: Incompatible,
	// Unavailable, Indeterminate outcomes, or HTTP answers other than 200
	// and 429 and transport errors.
	Other      int64            `json:"other"`
	OtherKinds map[string]int64 `json:"other_kinds,omitempty"`
	FirstError string           `json:"first_error,omitempty"`
	// StoppedEarly is true when the run stopped after its first 100
	// answers, every one an error (nothing to measure).
	StoppedEarly bool    `json:"stopped_early,omitempty"`
	P50          float64 `json:"p50_ms"`
	P99          float64 `json:"p99_ms"`
	P999         float64 `json:"p999_ms"`
	// KeysDeleted is how many keys under the run's own prefix were
	// deleted from Redis at the end.
	KeysDeleted int64 `json:"redis_keys_deleted,omitempty"`
}

// benchReadyWait bounds how long bench waits for Redis before a run.
const benchReadyWait = 5 * time.Second

// waitReady asks ready until it answers nil or wait has passed, and
// returns the last error that says what Redis answered (not the circuit
// breaker's). redisstore.New does not contact Redis; this makes a run
// measure decisions rather than the loading of the code on the first
// ones, and an unreachable Redis an error that names it.
func waitReady(ready func(context.Context) error, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var reason error
	for {
		err := ready(ctx)
		switch {
		case err == nil:
			return nil
		case reason == nil || !errors.Is(err, sluice.CircuitOpen):
			reason = err
		}
		select {
		case <-ctx.Done():
			return reason
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Write prints rep: as indented JSON, or as a table.
func (rep *Report) Write(w io.Writer, asJSON bool) error {
	if !asJSON {
		rep.writeTable(w)
		return nil
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func newRunID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// benchDecider takes one decision for subject.
type benchDecider func(ctx context.Context, subject string) (sluice.Kind, error)

// httpDecider asks the server at base over keep-alive connections, one
// per caller, with token (when not "") as a bearer token, trusting the
// certificates of caFile (when not "") for https.
func httpDecider(base, token, caFile, policy string, subjects []string, callers int) (benchDecider, func(), error) {
	tr := &http.Transport{MaxIdleConns: callers + 8, MaxIdleConnsPerHost: callers + 8, IdleConnTimeout: time.Minute, DisableCompression: true}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, nil, fmt.Errorf("bench: --ca-file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("bench: --ca-file %s: no PEM certificate in it", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := strings.TrimSuffix(base, "/") + "/v1/check"
	bodies := make(map[string][]byte, len(subjects))
	for _, s := range subjects {
		b, _ := json.Marshal(map[string]string{"policy": policy, "subject": s})
		bodies[s] = b
	}
	return func(ctx context.Context, subject string) (sluice.Kind, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[subject]))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		var answer struct {
			Outcome string `json:"outcome"`
			Reason  string `json:"reason"`
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return sluice.Allowed, nil
		case http.StatusTooManyRequests:
			return sluice.Denied, nil
		}
		json.Unmarshal(body, &answer)
		err = fmt.Errorf("POST %s: %s", url, resp.Status)
		if answer.Reason != "" {
			err = fmt.Errorf("%w: %s", err, answer.Reason)
		}
		switch answer.Outcome {
		case "unavailable":
			return sluice.Unavailable, err
		case "indeterminate":
			return sluice.Indeterminate, err
		case "incompatible":
			return sluice.Incompatible, err
		}
		return 0, err
	}, tr.CloseIdleConnections, nil
}

// deletePrefix deletes every key under prefix on every master, one DEL per
// key (a cluster refuses DEL across slots), pipelined per SCAN batch. It
// stops after 100 000 SCAN calls per node.
func deletePrefix(ctx context.Context, client redis.UniversalClient, prefix string) (int64, error) {
	var deleted atomic.Int64
	sweep := func(ctx context.Context, c *redis.Client) error {
		var cursor uint64
		for range 100_000 {
			keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
			if err != nil {
				return fmt.Errorf("SCAN: %w", err)
			}
			if len(keys) > 0 {
				cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.Del(ctx, k)
					}
					return nil
				})
				if err != nil {
					return fmt.Errorf("DEL: %w", err)
				}
				for _, cmd := range cmds {
					deleted.Add(cmd.(*redis.IntCmd).Val())
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
		return errors.New("SCAN did not finish within 100000 calls")
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, sweep)
	case *redis.Client:
		err = sweep(ctx, c)
	default:
		err = fmt.Errorf("cannot scan a %T", client)
	}
	return deleted.Load(), err
}
