package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server/config"
)

// TestProxyReleasesWhenTheAnswerIsFinished: a route limited to one
// request at once holds its lease while the upstream answers, body
// included, and gives it back when the answer is finished.
func TestProxyReleasesWhenTheAnswerIsFinished(t *testing.T) {
	headers, finish := make(chan struct{}), make(chan struct{})
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
	}}, nil, []sluice.Policy{{ID: "one", Algorithm: sluice.Concurrency, Limit: 1, LeaseTTL: time.Hour}})

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
	// writing it, so allow it a bounded number of tries to get there.
	for i := 0; ; i++ {
		resp := f.send(t, "GET", "/", "")
		if resp.StatusCode == http.StatusOK {
			break
		}
		if i == 1000 {
			t.Fatalf("request after the answer finished: %d, want 200 (lease released)", resp.StatusCode)
		}
		time.Sleep(time.Millisecond)
	}
}
