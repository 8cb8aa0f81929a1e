package redisstore_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/evaluation"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// The servers every test of this package shares, started on first use and
// stopped after the last test. Tests keep apart by using their own subjects.
var (
	shared struct {
		standaloneOnce, clusterOnce sync.Once
		standalone                  *redistest.Server
		cluster                     *redistest.ClusterServers
		standaloneErr, clusterErr   error
	}
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		os.Exit(helperProcess(addr))
	}
	if spec := os.Getenv(leaseHelperEnv); spec != "" {
		os.Exit(leaseHelper(spec))
	}
	flag.Parse()
	code := m.Run()
	if shared.standalone != nil {
		shared.standalone.Stop()
	}
	if shared.cluster != nil {
		shared.cluster.Stop()
	}
	os.Exit(code)
}

// standaloneClient returns a client of the shared standalone server.
func standaloneClient(t testing.TB) *redis.Client {
	t.Helper()
	shared.standaloneOnce.Do(func() {
		shared.standalone, shared.standaloneErr = redistest.StartServer("")
	})
	if shared.standaloneErr != nil {
		t.Fatal(shared.standaloneErr)
	}
	c := shared.standalone.Client()
	t.Cleanup(func() { c.Close() })
	return c
}

// clusterClient returns a client of the shared 3-master cluster.
func clusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	shared.clusterOnce.Do(func() {
		shared.cluster, shared.clusterErr = redistest.StartCluster(3, 1)
	})
	if shared.clusterErr != nil {
		t.Fatal(shared.clusterErr)
	}
	c := shared.cluster.Client()
	t.Cleanup(func() { c.Close() })
	return c
}

// newStore returns a store over c, failing the test on error. Unless
// opts says otherwise, calls may take 10s: other work on a small machine
// must not turn into timeouts.
func newStore(t testing.TB, c redis.UniversalClient, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	s, err := redisstore.New(c, opts)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// callerStore returns a store in caller-clock mode, unbounded regression,
// driven by a fake clock; keys live an hour longer than the fake clock
// would need, as the fake clock does not advance with Redis's.
func callerStore(t testing.TB, c redis.UniversalClient) (*redisstore.Store, *sluicetest.Clock) {
	clock := sluicetest.NewClock()
	return newStore(t, c, redisstore.Options{Clock: clock, MaxClockRegression: -1, ExtraTTL: time.Hour}), clock
}

// subject returns a subject no other test uses.
func subject(t testing.TB) string {
	name := strings.NewReplacer(" ", "_", "{", "(", "}", ")").Replace(t.Name())
	if len(name) > 150 {
		name = name[len(name)-150:]
	}
	return fmt.Sprintf("%s.%x", name, rand.Uint64())
}

// policy returns a validated policy with defaults applied.
func policy(t testing.TB, id string, alg sluice.Algorithm, limit int64, window time.Duration) *sluice.Policy {
	t.Helper()
	p := sluice.Policy{ID: id, Algorithm: alg, Limit: limit, Window: window}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	p = evaluation.Defaults(p)
	return &p
}

// clockStart is the instant a new sluicetest.Clock reads.
var clockStart = sluicetest.NewClock().Now()

var algorithms = []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA}

// evaluate runs one decision.
func evaluate(ctx context.Context, s sluice.Store, subject string, cost int64, ps ...*sluice.Policy) ([]sluice.Status, error) {
	ev := &sluice.Evaluation{Subject: subject, Policies: ps, Cost: cost}
	if cost == 0 {
		ev.Op = sluice.Peek
	}
	if err := s.Evaluate(ctx, formed(ev, false)); err != nil {
		return nil, err
	}
	return ev.Statuses, nil
}

// mustEvaluate runs one decision, failing the test on error.
func mustEvaluate(t testing.TB, s sluice.Store, subject string, cost int64, ps ...*sluice.Policy) []sluice.Status {
	t.Helper()
	st, err := evaluate(context.Background(), s, subject, cost, ps...)
	if err != nil {
		t.Fatalf("Evaluate(%q, cost=%d): %v", subject, cost, err)
	}
	return st
}

// The helper-process half of TestTwoProcesses.
const helperEnv = "SLUICE_REDISSTORE_HELPER_ADDR"

func helperProcess(addr string) int {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p := evaluation.Defaults(sluice.Policy{ID: os.Getenv("SLUICE_HELPER_POLICY"), Algorithm: sluice.FixedWindow, Limit: helperLimit, Window: time.Hour})
	subj := os.Getenv("SLUICE_HELPER_SUBJECT")
	admitted := 0
	for range helperCalls {
		st, err := evaluate(context.Background(), s, subj, 1, &p)
		if err != nil {
			if errors.Is(err, sluice.ErrIndeterminate) {
				fmt.Fprintln(os.Stderr, err)
				return 3
			}
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if st[0].Allowed {
			admitted++
		}
	}
	fmt.Printf("admitted %d\n", admitted)
	return 0
}

// helperLimit and helperCalls size TestTwoProcesses: two processes of
// helperCalls checks each against one limit.
const (
	helperLimit = 60
	helperCalls = 50
)
