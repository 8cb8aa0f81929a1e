package rls_test

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/evaluation"
	"github.com/sluicehq/sluice/internal/simulate"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/sluicetest"
)

// hotRules is one rule whose descriptor a hot tenant's every request
// carries: limit a second by algorithm, local quota on when local.
func hotRules(algorithm string, limit int, local bool) string {
	lq := ""
	if local {
		lq = ", sluice_local_quota: true"
	}
	return fmt.Sprintf("domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit: { unit: second, requests_per_unit: %d, algorithm: %s%s }\n", limit, algorithm, lq)
}

// hotPhase is traffic at rate times the limit, for span.
type hotPhase struct {
	rate float64
	span time.Duration
}

// offerHot offers one tenant's descriptor the phases' traffic (rates of
// limit a second) over gRPC,
// one request at a time on clock (a seed gives one sequence), and
// returns the admission times (µs) and, over the phases below the limit,
// the decisions and the store calls.
func offerHot(t *testing.T, h *harness, store *countingStore, clock *sluicetest.Clock, limit int, seed uint64, phases []hotPhase) (admitted []int64, decisions, calls int64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	req := &rlspb.RateLimitRequest{Domain: "shop", Descriptors: ds(d("tenant", "big"))}
	for _, ph := range phases {
		end := clock.Now().Add(ph.span)
		mean := float64(time.Second) / (ph.rate * float64(limit))
		before := store.n.Load()
		for n := int64(0); clock.Now().Before(end); n++ {
			_, _, resp := h.ask(t, req)
			switch resp.OverallCode {
			case rlspb.RateLimitResponse_OK:
				admitted = append(admitted, clock.Now().UnixMicro())
			case rlspb.RateLimitResponse_OVER_LIMIT:
			default:
				t.Fatalf("ShouldRateLimit = %v, want a decision", resp.OverallCode)
			}
			if ph.rate < 1 {
				decisions++
			}
			clock.Advance(time.Duration(rng.ExpFloat64()*mean) + time.Microsecond)
		}
		if ph.rate < 1 {
			calls += store.n.Load() - before
		}
	}
	return admitted, decisions, calls
}

// hotHarness serves hotRules over a store of newStore's on a fake clock
// the Limiter shares, counting the store's calls.
func hotHarness(t *testing.T, newStore quotaStore, algorithm string, limit int, local bool) (*harness, *countingStore, *sluicetest.Clock, *sluice.Limiter) {
	t.Helper()
	clock := sluicetest.NewClock()
	store := &countingStore{Store: newStore(t, clock)}
	var lim *sluice.Limiter
	h := startWith(t, store, hotRules(algorithm, limit, local), func(st *rls.State) {
		var err error
		if lim, err = sluice.New(store, st.Rules.Policies(), sluice.Options{Clock: clock}); err != nil {
			t.Fatal(err)
		}
		st.Limiter = lim
		// The edge's deadline is a bound on a loaded machine here, not a
		// threshold: these tests count store calls and admissions, and a
		// real Redis under the race detector beside other tests can take
		// past the default 500ms.
		if st.Core, err = edge.New(lim, edge.Options{Deadline: askTimeout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Prefix: "rls"}); err != nil {
			t.Fatal(err)
		}
	})
	return h, store, clock, lim
}

// TestLocalQuotaPerRule: a rule with sluice_local_quota on a hot
// descriptor, asked over gRPC, is decided from blocks of local quota: a
// tenant at a hundredth of a limit of 100 000 a second reaches the store
// at most once in 20 decisions (once in one without the key), and a
// tenant offered below and at four times a limit of 400 a second is
// never admitted more than the algorithm admits, judged from the
// admission times alone (simulate.OverBound, the check of
// docs/local-quota.md's bound); on both stores.
func TestLocalQuotaPerRule(t *testing.T) {
	traffic := []hotPhase{{0.5, 2 * time.Second}, {4, 500 * time.Millisecond}, {0.01, time.Second}, {0.8, time.Second}, {4, 250 * time.Millisecond}}
	redis := redistest.Standalone(t)
	stores := map[string]quotaStore{"memstore": memQuota, "redis": redisQuota(redis)}
	for _, sname := range []string{"memstore", "redis"} {
		for _, alg := range []string{"gcra", "token_bucket", "fixed_window"} {
			if sname == "redis" && alg != "gcra" {
				continue // the stores' equivalence is redisstore's differential tests'
			}
			t.Run(sname+"/"+alg, func(t *testing.T) {
				for _, local := range []bool{true, false} {
					h, store, clock, _ := hotHarness(t, stores[sname], alg, 100_000, local)
					offerHot(t, h, store, clock, 100_000, 1, []hotPhase{{0.01, 300 * time.Millisecond}}) // the arrival rate is learnt over three block times
					_, decisions, calls := offerHot(t, h, store, clock, 100_000, 2, []hotPhase{{0.01, 500 * time.Millisecond}})
					perDecision := float64(calls) / float64(decisions)
					t.Logf("local quota %v: %d decisions, %d store calls (%.3f each)", local, decisions, calls, perDecision)
					if local && perDecision > 0.05 {
						t.Errorf("with sluice_local_quota: %d store calls for %d decisions (%.3f each): want at most 0.05", calls, decisions, perDecision)
					}
					if !local && calls != decisions {
						t.Errorf("without sluice_local_quota: %d store calls for %d decisions, want one each", calls, decisions)
					}
					if !local {
						continue // the bound without local quota is the stores' own tests'
					}
					h, store, clock, lim := hotHarness(t, stores[sname], alg, 400, local)
					adm, _, _ := offerHot(t, h, store, clock, 400, 1, traffic)
					p, _ := lim.Policy("shop.tenant")
					p = evaluation.Defaults(p)
					params := algorithm.Params{Limit: p.Limit, Window: p.Window.Microseconds(), Burst: p.Burst, Aligned: p.ClockAligned}
					if msg := simulate.OverBound(algorithm.Kind(p.Algorithm), params, adm, sluicetest.NewClock().Now().UnixMicro()); msg != "" {
						t.Errorf("with sluice_local_quota: %s", msg)
					}
					t.Logf("with sluice_local_quota: %d admitted at a limit of 400/s", len(adm))
				}
			})
		}
	}
}
