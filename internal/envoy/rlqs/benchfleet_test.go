//go:build unix

package rlqs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
	"github.com/sluicehq/sluice/subject"
)

// The fleet the benchmarks of bench_test.go drive: streams Envoy-like
// clients, each reporting the same buckets of one domain (the fleet sees
// the same tenants), over real gRPC on loopback.

// fleetShape is a fleet's size: streams × buckets each stream reports.
type fleetShape struct{ streams, buckets int }

func (f fleetShape) String() string { return fmt.Sprintf("%dx%d", f.streams, f.buckets) }

// benchShapes: the 1 000 × 100, and as many holds as 10 000
// streams of 10 buckets.
var benchShapes = []fleetShape{{1000, 100}, {10000, 10}}

// benchPolicy is each bucket's: 100 000 a second, burst 100 000, so that
// each of 1 000 or 10 000 streams has a share Envoy can express.
var benchPolicy = sluice.Policy{ID: "per-tenant", Algorithm: sluice.TokenBucket, Limit: 100_000, Window: time.Second, Burst: 100_000}

func benchConfig(domain string) Config {
	return Config{Domains: []Domain{{Name: domain, Matchers: []Matcher{{Match: map[string]string{"tenant": "*", "route": "api"}, Policy: benchPolicy}}}}}
}

// maxConns bounds the fleet's connections (two descriptors each with the
// server in process): past 1 000 streams, streams share connections.
const maxConns = 1000

// benchServerEnv, when set, makes the test binary a benchmark's server
// (TestMain): a Service on loopback, driven by lines on stdin.
const benchServerEnv = "SLUICE_RLQS_BENCH_SERVER"

// TestMain runs the benchmark's server process when asked to, else the
// tests, then removes the binary servetest built for the fleet tests.
func TestMain(m *testing.M) {
	if os.Getenv(benchServerEnv) != "" {
		os.Exit(serveBenchChild())
	}
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// startBenchService starts a Service with its rounds run by hand, on a
// frozen fake clock (no assignment ages during a run), with metrics as
// sluice serve registers them and serve's gRPC server options, on
// loopback. stop stops the gRPC server.
func startBenchService(domain string, opts Options) (svc *Service, addr string, stop func(), err error) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		return nil, "", nil, err
	}
	if opts.Clock == nil {
		opts.Clock = &fakeClock{t: time.Unix(1_800_000_000, 0)}
	}
	opts.Pseudonymizer, opts.Metrics, opts.manual = subject.Unkeyed(), m, true
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if svc, err = New(benchConfig(domain), opts); err != nil {
		return nil, "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", nil, err
	}
	g := grpc.NewServer(rls.ServerOptions()...)
	svc.Register(g)
	go func() { _ = g.Serve(ln) }()
	return svc, ln.Addr().String(), g.Stop, nil
}

// serveBenchChild is the server process of BenchmarkRLQSReport's
// server-process runs: it prints its address, then answers each line of
// stdin: "round" runs a round, "stats" prints the process's CPU time
// (ns), its allocations so far and its heap in use (bytes). It ends at
// the end of stdin.
func serveBenchChild() int {
	svc, addr, stop, err := startBenchService("edge", Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	fmt.Println(addr)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "round":
			svc.round(context.Background())
			fmt.Println("ok")
		case "stats":
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Println(cpuTime().Nanoseconds(), ms.Mallocs, ms.HeapInuse)
		}
	}
	return 0
}

// childServer is the parent's end of serveBenchChild.
type childServer struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	addr string
}

// startChild runs this test binary as a benchmark's server.
func startChild() (*childServer, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchServerEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &childServer{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	if !c.out.Scan() {
		c.stop()
		return nil, errors.New("the server process printed no address")
	}
	c.addr = c.out.Text()
	return c, nil
}

// ask sends line and returns the answer's fields.
func (c *childServer) ask(line string) ([]string, error) {
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		return nil, err
	}
	if !c.out.Scan() {
		return nil, fmt.Errorf("the server process ended: %v", c.out.Err())
	}
	return strings.Fields(c.out.Text()), nil
}

// childStats is what the server process says of itself.
type childStats struct {
	cpu     time.Duration
	mallocs uint64
	heap    uint64
}

func (c *childServer) stats() (childStats, error) {
	f, err := c.ask("stats")
	if err != nil || len(f) != 3 {
		return childStats{}, fmt.Errorf("stats: %q, %v", f, err)
	}
	var n [3]uint64
	for i := range n {
		if n[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return childStats{}, err
		}
	}
	return childStats{time.Duration(n[0]), n[1], n[2]}, nil
}

func (c *childServer) stop() {
	c.in.Close()
	_ = c.cmd.Wait()
}

// cpuTime is this process's CPU time, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchFleet is the clients: streams spread over at most maxConns
// connections.
type benchFleet struct {
	shape   fleetShape
	conns   []*grpc.ClientConn
	streams []*benchStream
	cancel  context.CancelFunc
	first   *rlqspb.RateLimitQuotaUsageReports // a stream's first: names the domain, nothing elapsed yet
	steady  *rlqspb.RateLimitQuotaUsageReports // every later one: 5 s elapsed, 50 requests a bucket
}

// benchStream is one client's stream; a reader counts the actions it
// receives.
type benchStream struct {
	s    rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	acts atomic.Int64
	last atomic.Pointer[rlqspb.RateLimitQuotaResponse]
	got  chan struct{} // a message arrived
	done chan struct{} // the stream ended; err says why
	err  error
}

func (st *benchStream) read() {
	defer close(st.done)
	for {
		m, err := st.s.Recv()
		if err != nil {
			st.err = err
			return
		}
		st.last.Store(m)
		st.acts.Add(int64(len(m.GetBucketAction())))
		select {
		case st.got <- struct{}{}:
		default:
		}
	}
}

// report sends m and waits until want more actions have arrived (a
// report's answer: one action per bucket), or until timeout fires (nil:
// never).
func (st *benchStream) report(m *rlqspb.RateLimitQuotaUsageReports, want int64, timeout <-chan time.Time) error {
	before := st.acts.Load()
	if err := st.s.Send(m); err != nil {
		return err
	}
	for st.acts.Load() < before+want {
		select {
		case <-st.got:
		case <-st.done:
			return fmt.Errorf("the stream ended: %w", st.err)
		case <-timeout:
			return fmt.Errorf("%d of %d actions after a report", st.acts.Load()-before, want)
		}
	}
	return nil
}

func benchReports(domain string, buckets int, allowed uint64, elapsed time.Duration) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: domain}
	for i := range buckets {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("t%04d", i), "route": "api"}},
			NumRequestsAllowed: allowed, TimeElapsed: durationpb.New(elapsed)})
	}
	return m
}

// dialFleet opens the fleet's streams to addr and sends each its first
// report, waiting for every answer.
func dialFleet(addr, domain string, f fleetShape) (*benchFleet, error) {
	ctx, cancel := context.WithCancel(context.Background())
	fl := &benchFleet{shape: f, cancel: cancel, first: benchReports(domain, f.buckets, 10, 0), steady: benchReports("", f.buckets, 50, 5*time.Second)}
	for range min(f.streams, maxConns) {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fl.close()
			return nil, err
		}
		fl.conns = append(fl.conns, c)
	}
	for i := range f.streams {
		s, err := rlqspb.NewRateLimitQuotaServiceClient(fl.conns[i%len(fl.conns)]).StreamRateLimitQuotas(ctx)
		if err != nil {
			fl.close()
			return nil, err
		}
		st := &benchStream{s: s, got: make(chan struct{}, 1), done: make(chan struct{})}
		go st.read()
		fl.streams = append(fl.streams, st)
	}
	// One first report at a time: each is one ledger call of its
	// buckets, the same calls every run (rediscg differences two runs).
	if err := fl.all(fl.first, 1); err != nil {
		fl.close()
		return nil, err
	}
	return fl, nil
}

// all sends m on every stream, workers at a time, and waits for every
// answer.
func (fl *benchFleet) all(m *rlqspb.RateLimitQuotaUsageReports, workers int) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(fl.streams)); i = next.Add(1) - 1 {
				if err := fl.streams[i].report(m, int64(fl.shape.buckets), time.After(time.Minute)); err != nil {
					mu.Lock()
					first = cmpOr(first, fmt.Errorf("stream %d: %w", i, err))
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// settle brings the fleet to its steady state: a round, a report from
// every stream (its period seen: 5 s), then rounds until the split holds
// still; it checks that an answer assigns token buckets.
func (fl *benchFleet) settle(round func() error) error {
	if err := round(); err != nil {
		return err
	}
	if err := fl.all(fl.steady, 64); err != nil {
		return err
	}
	for range 3 {
		if err := round(); err != nil {
			return err
		}
	}
	if err := fl.all(fl.steady, 64); err != nil {
		return err
	}
	for _, a := range fl.streams[0].last.Load().GetBucketAction() {
		if a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
			return fmt.Errorf("a steady answer is %v, want a token bucket", a)
		}
	}
	return nil
}

// received is the actions the fleet has received so far.
func (fl *benchFleet) received() int64 {
	var n int64
	for _, st := range fl.streams {
		n += st.acts.Load()
	}
	return n
}

func (fl *benchFleet) close() {
	fl.cancel()
	for _, c := range fl.conns {
		c.Close()
	}
}
