package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestProxyQueue: a route with max_delay 500ms on gcra 100/s, burst 5,
// offered twice what it can hold at one instant of the store's clock
// (110 requests: 5 fit now, 50 slots 10ms apart lie within 500ms): the
// 5 pass at once, the 50 are held for their slots and pass (each waited
// at most 500ms, on sluice_proxy_queue_wait_seconds), the other 55 are
// answered 429 at once (dropped, past_max_delay), and the upstream sees
// exactly the 55 that passed.
func TestProxyQueue(t *testing.T) {
	up := newUpstream(t)
	policies := []sluice.Policy{{ID: "paced", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 5}}
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/api"}, Policies: []string{"paced"}, Subject: "ip", MaxDelay: 500 * time.Millisecond},
	}}, nil, policies)
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 110 {
		wg.Go(func() {
			resp, err := http.Get(f.url + "/api/x")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusCreated] != 55 || codes[http.StatusTooManyRequests] != 55 {
		t.Fatalf("answers %v, want 55 passed (201 from the upstream) and 55 refused (429)", codes)
	}
	if n := len(up.requests()); n != 55 {
		t.Errorf("the upstream saw %d requests, want the 55 that passed", n)
	}
	got := scrape(t, f.metrics)
	for series, want := range map[string]float64{
		`sluice_proxy_queued_total{route="* /api"}`:                                     50,
		`sluice_proxy_queue_wait_seconds{route="* /api"}_count`:                         50,
		`sluice_proxy_queue_wait_seconds_bucket{le="0.5",route="* /api"}`:               50,
		`sluice_proxy_queue_wait_seconds_bucket{le="0.01",route="* /api"}`:              1,
		`sluice_proxy_queue_dropped_total{reason="past_max_delay",route="* /api"}`:      55,
		`sluice_proxy_decisions_total{action="admitted",route="* /api",shadow="false"}`: 55,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}

// bookStore is a memstore that reports each booking's Delay and each
// refund's outcome on channels, so a test knows when a request is held
// and when its slot was given back.
type bookStore struct {
	*memstore.Store
	books   chan time.Duration
	refunds chan sluice.Kind
}

func (s *bookStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error {
	err := s.Store.Evaluate(ctx, ev)
	switch {
	case ev.Op == sluice.Book && err == nil:
		s.books <- ev.Statuses[0].Delay
	case ev.Op == sluice.Refund:
		kind := sluice.Allowed
		if err != nil || !ev.Statuses[0].Allowed {
			kind = sluice.Incompatible
		}
		s.refunds <- kind
	}
	return err
}

// TestProxyQueueClientGoes: a client that goes away while its request
// is held for its slot gives the slot back (a refund, taken), is counted
// abandoned, and never reaches the upstream: the next request books the
// same slot, 1s ahead, not the one after it.
func TestProxyQueueClientGoes(t *testing.T) {
	up := newUpstream(t)
	clock := sluicetest.NewClock()
	ms, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	store := &bookStore{Store: ms, books: make(chan time.Duration, 8), refunds: make(chan sluice.Kind, 8)}
	policies := []sluice.Policy{{ID: "slow", Algorithm: sluice.GCRA, Limit: 1, Window: time.Second, Burst: 1, MaxWait: time.Minute}}
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/api"}, Policies: []string{"slow"}, Subject: "ip", MaxDelay: 10 * time.Second},
	}}, store, policies)
	if resp, err := http.Get(f.url + "/api/first"); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("first request: %v %v, want 201 at once", resp, err)
	} else {
		resp.Body.Close()
	}
	if d := <-store.books; d != 0 {
		t.Fatalf("first booking delay %v, want 0", d)
	}
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/api/held", nil)
		done := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		if d := <-store.books; d != time.Second {
			t.Fatalf("held request %d booked %v ahead, want 1s: an abandoned slot is given back", i, d)
		}
		cancel()
		if err := <-done; err == nil {
			t.Fatalf("held request %d: answered after its client went away", i)
		}
		if kind := <-store.refunds; kind != sluice.Allowed {
			t.Fatalf("held request %d: its slot's refund was %v, want allowed", i, kind)
		}
	}
	if n := len(up.requests()); n != 1 {
		t.Errorf("the upstream saw %d requests, want only the first", n)
	}
	// The handler counts its decision after the refund the test waited
	// for: closing the server waits for every handler still running.
	f.srv.Close()
	const abandoned = `sluice_proxy_queue_dropped_total{reason="abandoned",route="* /api"}`
	if n := scrape(t, f.metrics)[abandoned]; n != 2 {
		t.Fatalf("%s = %v, want 2", abandoned, n)
	}
}
