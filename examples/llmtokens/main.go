// Command llmtokens limits an LLM-style upstream by the tokens it uses, a
// cost known only once the upstream has answered: each team may use
// 1000 tokens per minute. The middleware spends an estimate of 300
// tokens before the call (sluice.Estimate), and once the upstream's
// answer is through, settles it with the tokens the upstream reported in
// its X-Tokens-Used header: the difference is given back, or the excess
// charged, past the limit if need be (the team then waits it off).
//
//	go run ./examples/llmtokens -try     # a fake upstream and the limiting proxy on loopback, four calls
//
// The fake upstream uses the number of tokens a request asks for
// (?tokens=N), as a model reports the tokens a completion used.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/subject"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "llmtokens:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmtokens", flag.ContinueOnError)
	fs.SetOutput(stderr)
	try := fs.Bool("try", false, "send four calls through the proxy, print the answers and exit")
	addr := fs.String("addr", "127.0.0.1:8080", "the proxy's listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	store, err := newStore()
	if err != nil {
		return err
	}
	defer store.Close()
	upstream, err := serve(ctx, "127.0.0.1:0", fakeUpstream())
	if err != nil {
		return err
	}
	defer upstream.Close()
	proxy, err := newProxy(store, "http://"+upstream.Addr)
	if err != nil {
		return err
	}
	if *try {
		*addr = "127.0.0.1:0"
	}
	srv, err := serve(ctx, *addr, proxy)
	if err != nil {
		return err
	}
	defer srv.Close()
	if *try {
		return tryIt(ctx, "http://"+srv.Addr, stdout)
	}
	fmt.Fprintf(stdout, "proxying http://%s/v1/complete?tokens=N (X-Team: a) to the fake model at %s, 1000 tokens per minute per team\n", srv.Addr, upstream.Addr)
	<-ctx.Done()
	return nil
}

// newProxy returns the limiting reverse proxy to upstream: route
// /v1/complete spends an estimate of 300 tokens per call from the team's
// 1000 per minute, settled with the upstream's X-Tokens-Used.
func newProxy(store sluice.Store, upstream string) (http.Handler, error) {
	lim, err := sluice.New(store, []sluice.Policy{{
		ID: "tokens", Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Minute,
		DedupeTTL: 5 * time.Minute, // how long an estimate waits for its settle: the longest call
	}}, sluice.Options{})
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	team, err := subject.Header("X-Team")
	if err != nil {
		return nil, err
	}
	mw, err := httplimit.New(lim, httplimit.Options{
		Routes: []httplimit.Route{{
			PathPrefix: "/v1/complete", Policies: []string{"tokens"},
			Cost: 300, SettleHeader: "X-Tokens-Used", // the estimate, and where the upstream reports the real cost
			Subject: team,
		}},
	})
	if err != nil {
		return nil, err
	}
	return mw.Handler(httputil.NewSingleHostReverseProxy(u)), nil
}

// fakeUpstream answers /v1/complete as a model would, using the tokens
// the request asks for (?tokens=N, default 100) and reporting them in
// X-Tokens-Used.
func fakeUpstream() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used, err := strconv.Atoi(r.URL.Query().Get("tokens"))
		if err != nil {
			used = 100
		}
		w.Header().Set("X-Tokens-Used", strconv.Itoa(used))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"completion":"…","usage":{"total_tokens":%d}}`+"\n", used)
	})
}

// server is an HTTP server on a loopback listener.
type server struct {
	*http.Server
	Addr string
}

// serve serves h on addr until Close.
func serve(ctx context.Context, addr string, h http.Handler) (*server, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &server{Server: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, Addr: ln.Addr().String()}
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "llmtokens:", err)
		}
	}()
	return s, nil
}

// tryIt sends four calls as team a, one at a time over one connection
// (each settled before the next is read), and prints the answers.
func tryIt(ctx context.Context, base string, stdout io.Writer) error {
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	for _, tokens := range []int{100, 1200, 50, 50} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/complete?tokens=%d", base, tokens), nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Team", "a")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Fprintf(stdout, "asked %4d tokens: %d %s\n", tokens, resp.StatusCode, resp.Header.Get("RateLimit"))
	}
	return nil
}
