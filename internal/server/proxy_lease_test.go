package server_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/memstore"
)

// TestProxyReleasesWhenTheAnswerIsFinished: a route limited to one
// request at once holds its lease while the upstream answers, body
// included, and gives it back when the answer is finished.
func TestProxyReleasesWhenTheAnswerIsFinished(t *testing.T) {
	headers, finish := make(chan struct{}), make(chan struct{})
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	released := &releaseSignal{Store: ms, done: make(chan struct{}, 1)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			headers <- struct{}{}
			<-finish // the body is still being written
		}
		io.WriteString(w, "done")
	}))
	t.Cleanup(up.Close)
	f := newProxyFixture(t, &config.Proxy{Upstream: up.URL, Routes: []config.Route{
		{Match: config.Match{PathPrefix: "/"}, Policies: []string{"one"}, Subject: "ip"},
	}}, released, []sluice.Policy{{ID: "one", Algorithm: sluice.Concurrency, Limit: 1, LeaseTTL: time.Hour}})

	slow := make(chan string)
	go func() {
		resp, err := http.Get(f.url + "/slow")
		if err != nil {
			t.Errorf("GET /slow: %v", err)
			slow <- ""
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-headers
	if resp := f.send(t, "GET", "/", ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("request while the first answer is being sent: %d, want 429", resp.StatusCode)
	}
	close(finish)
	if body := <-slow; body != "done" {
		t.Fatalf("slow answer body %q, want done", body)
	}
	// The client has the whole answer; the proxy releases right after
	// writing it: wait for that release to be decided by the store.
	select {
	case <-released.done:
	case <-time.After(10 * time.Second): // a bound, not a wait
		t.Fatal("the proxy gave back no lease within 10s of the answer's end")
	}
	if resp := f.send(t, "GET", "/", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("request after the answer finished: %d, want 200 (lease released)", resp.StatusCode)
	}
}

// releaseSignal is a Store that tells, on done, each time a Release it
// passed on to the store beneath has been decided.
type releaseSignal struct {
	sluice.Store
	done chan struct{}
}

func (s *releaseSignal) Evaluate(ctx context.Context, e *sluice.Evaluation) error {
	err := s.Store.Evaluate(ctx, e)
	if e.Op == sluice.Release {
		s.done <- struct{}{}
	}
	return err
}
