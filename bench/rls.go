package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
)

// rlsRules is the rules file both RLS servers get, in envoyproxy/ratelimit's
// format: every value of the descriptor key user is a subject of its own,
// with a fixed window of a second (the allowed mode's limit) as
// envoyproxy/ratelimit's own benchmark rules are written.
func rlsRules(m mode) string {
	unit, n := "second", int64(1_000_000)
	if m == deniedMode {
		unit, n = "hour", 1
	}
	return fmt.Sprintf("domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n", unit, n)
}

// rlsLocalQuota is the row of sluice serve whose rule asks local quota
// (sluice_local_quota: true, a key envoyproxy/ratelimit's loader refuses,
// so theirs is given rlsRules alone).
const rlsLocalQuota = "sluice serve, local quota"

// rlsWho are the servers runRLS measures in a cell of mode m, in order:
// sluice serve, with -rls-local-quota sluice serve with local quota on
// the rule (allowed mode only: 1 an hour is too small for blocks), and
// with -envoy-ratelimit theirs.
func rlsWho(cfg *config, m mode) []string {
	who := []string{"sluice serve"}
	if cfg.rlsLocalQuota && m == allowedMode {
		who = append(who, rlsLocalQuota)
	}
	if cfg.envoyRatelimit != "" {
		who = append(who, "envoyproxy/ratelimit")
	}
	return who
}

// rlsDecide drives ShouldRateLimit on addr over one gRPC connection (as an
// Envoy holds one HTTP/2 connection to its rate-limit cluster), one
// descriptor user=<subject> per request.
func rlsDecide(addr string, subjects []string) (decideFunc, func(), error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	client := rlspb.NewRateLimitServiceClient(conn)
	reqs := make([]*rlspb.RateLimitRequest, len(subjects))
	for i, s := range subjects {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: s}}},
		}}
	}
	return func(ctx context.Context, i int) (int, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, reqs[i])
		if err != nil {
			return 0, err
		}
		switch resp.OverallCode {
		case rlspb.RateLimitResponse_OK:
			return 1, nil
		case rlspb.RateLimitResponse_OVER_LIMIT:
			return 0, nil
		}
		return 0, fmt.Errorf("ShouldRateLimit: code %v", resp.OverallCode)
	}, func() { conn.Close() }, nil
}

// runRLS measures the Envoy rate-limit service of sluice serve (bin) on
// Redis and, when envoyBin is set, envoyproxy/ratelimit built from its Go
// module on the same Redis, in every cell: decisions/s, the server's CPU
// and Redis CPU per decision.
func runRLS(ctx context.Context, cfg *config, e *env, bin, dir, redisAddr string, cells []cell, stderr io.Writer) ([]result, error) {
	var rs []result
	for _, c := range cells {
		var row []result
		for _, who := range rlsWho(cfg, c.mode) {
			if err := e.admin.FlushAll(ctx).Err(); err != nil {
				return nil, err
			}
			rules := filepath.Join(dir, "rls-"+string(c.mode), "config")
			if err := os.MkdirAll(rules, 0o700); err != nil {
				return nil, err
			}
			text := rlsRules(c.mode)
			if who == rlsLocalQuota {
				text += "      sluice_local_quota: true\n"
			}
			if err := os.WriteFile(filepath.Join(rules, "bench.yaml"), []byte(text), 0o600); err != nil {
				return nil, err
			}
			var addr string
			var cpu func() float64
			var stop func() error
			if who != "envoyproxy/ratelimit" {
				path := filepath.Join(dir, "rls-"+string(c.mode)+".yaml")
				yaml := policiesYAML(parseAlgorithmOr(cfg.httpAlgorithm)) +
					fmt.Sprintf("store:\n  type: redis\n  redis: { url: \"redis://%s/0\" }\nenvoy:\n  listen: \"127.0.0.1:0\"\n  configs: [%q]\n", redisAddr, filepath.Join(rules, "*.yaml"))
				if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
					return nil, err
				}
				sv, err := startServe(ctx, bin, path)
				if err != nil {
					return nil, err
				}
				if sv.envoy == "" {
					sv.stop()
					return nil, errors.New("sluice serve logged no envoy rate-limit listener")
				}
				addr, cpu, stop = sv.envoy, sv.cpu, sv.stop
			} else {
				p, err := startEnvoyRatelimit(ctx, cfg.envoyRatelimit, filepath.Dir(rules), redisAddr, cfg.pool)
				if err != nil {
					return nil, err
				}
				addr, cpu, stop = p.addr, p.sv.cpu, p.sv.stop
			}
			d, release, err := rlsDecide(addr, e.subjects[:c.subjects])
			if err != nil {
				stop()
				return nil, err
			}
			r := result{Limiter: who + " (Envoy RLS, redis)", Kind: kindHTTP, Peer: who == "envoyproxy/ratelimit", Callers: c.callers, Subjects: c.subjects, Mode: c.mode}
			err = measure(ctx, e, &r, d, 1, c, cfg.run, true, cpu)
			release()
			if serr := stop(); err == nil && serr != nil && who != "envoyproxy/ratelimit" {
				err = serr
			}
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", c, r.Limiter, err)
			}
			r.RoundTripsPerDecision = 0
			fmt.Fprintf(stderr, "[RLS] %s: %-45s %10.0f per second  server %6.1f µs/dec  redis %5.2f µs/dec  %.4f cmds/dec  %.4f scripts/dec  errors %d\n",
				c, r.Limiter, r.PerSecond, r.ServerCPUPerDecision, r.RedisCPUPerDecision, r.RedisCommandsPerDecision, r.ScriptCallsPerDecision, r.Errors)
			row = append(row, r)
		}
		rlsRatios(stderr, c, row)
		rs = append(rs, row...)
	}
	return rs, nil
}

// rlsRatios prints, for one cell, each sluice row's server and Redis CPU
// per decision divided by envoyproxy/ratelimit's in the same cell.
func rlsRatios(w io.Writer, c cell, row []result) {
	var theirs *result
	for i := range row {
		if row[i].Peer {
			theirs = &row[i]
		}
	}
	if theirs == nil || theirs.ServerCPUPerDecision == 0 || theirs.RedisCPUPerDecision == 0 {
		return
	}
	for _, r := range row {
		if !r.Peer {
			fmt.Fprintf(w, "[RLS] %s: %-45s ÷ envoyproxy/ratelimit: server CPU %.3f×  Redis CPU %.3f×\n",
				c, r.Limiter, r.ServerCPUPerDecision/theirs.ServerCPUPerDecision, r.RedisCPUPerDecision/theirs.RedisCPUPerDecision)
		}
	}
}

// parseAlgorithmOr is parseAlgorithm, GCRA for a spelling it does not know.
func parseAlgorithmOr(s string) sluice.Algorithm {
	a, err := parseAlgorithm(s)
	if err != nil {
		return sluice.GCRA
	}
	return a
}

// envoyRatelimit is an envoyproxy/ratelimit process this run started.
type envoyRatelimit struct {
	sv   *served
	addr string
}

// startEnvoyRatelimit runs envoyproxy/ratelimit's service_cmd on free
// loopback ports, its rules read from runtime/config (the layout its
// RUNTIME_* settings name), backed by the Redis at redisAddr, statsd off,
// and waits (at most 30 s) until its gRPC port accepts connections.
func startEnvoyRatelimit(ctx context.Context, bin, runtime, redisAddr string, pool int) (*envoyRatelimit, error) {
	ports := make([]int, 3)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close() // reserved only to learn a free port
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT="+strconv.Itoa(ports[0]), "GRPC_PORT="+strconv.Itoa(ports[1]), "DEBUG_PORT="+strconv.Itoa(ports[2]),
		"USE_STATSD=false", "LOG_LEVEL=warn", "BACKEND_TYPE=redis",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "REDIS_POOL_SIZE="+strconv.Itoa(pool),
		"RUNTIME_ROOT="+filepath.Dir(runtime), "RUNTIME_SUBDIRECTORY="+filepath.Base(runtime), "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false",
	)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	return startEnvoyCmd(ctx, cmd, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])))
}

func startEnvoyCmd(ctx context.Context, cmd *exec.Cmd, addr string) (*envoyRatelimit, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &envoyRatelimit{sv: &served{cmd: cmd}, addr: addr}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return p, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.sv.stop()
	return nil, fmt.Errorf("envoyproxy/ratelimit did not listen on %s within 30s", addr)
}
