// Command demo is a tiny application whose /demo endpoint is limited to
// 3 requests per 10 seconds per account, with the embedded store:
//
//	go run ./examples/demo                  # serves on 127.0.0.1:8080
//	curl -i 'http://127.0.0.1:8080/demo?account=alice'   # 200, 200, 200, then 429
//
//	go run ./examples/demo -try             # sends the four requests itself
//
// The fourth request within 10 seconds is answered 429 Too Many Requests
// with Retry-After, the draft RateLimit-Policy and RateLimit fields, and an
// application/problem+json body.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/subject"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	try := fs.Bool("try", false, "listen on a free port, send four requests as one account, print the answers and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}

	store, err := memstore.New(memstore.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	handler, err := newHandler(store, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}

	if *try {
		*addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	defer srv.Close()

	if *try {
		return tryIt(ctx, "http://"+ln.Addr().String()+"/demo?account=alice", stdout)
	}
	fmt.Fprintf(stdout, "serving on http://%s/demo?account=alice (3 requests per 10s per account)\n", ln.Addr())
	select {
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdown)
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// newHandler returns the application: /demo behind the rate limiter.
func newHandler(store sluice.Store, logger *slog.Logger) (http.Handler, error) {
	limiter, err := sluice.New(store, []sluice.Policy{
		{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
	}, sluice.Options{})
	if err != nil {
		return nil, err
	}
	limit, err := httplimit.New(limiter, httplimit.Options{
		Routes: []httplimit.Route{{PathPrefix: "/demo", Policies: []string{"demo"}}},
		// Requests without an account are denied (403), not pooled.
		Subject: subject.Principal(account),
		Logger:  logger,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /demo", func(w http.ResponseWriter, r *http.Request) {
		a, _ := account(r)
		fmt.Fprintf(w, "hello, %s\n", a)
	})
	return limit.Handler(mux), nil
}

// account is the principal the demo limits by. It trusts the X-Account
// header or the account query parameter, which anyone can set: a real
// application returns the principal its authentication established (a
// session's user ID, a verified token's subject), never a value the client
// simply asserts.
func account(r *http.Request) (string, bool) {
	a := r.Header.Get("X-Account")
	if a == "" {
		a = r.URL.Query().Get("account")
	}
	return a, a != ""
}

// tryIt sends four requests to url and prints each answer.
func tryIt(ctx context.Context, url string, stdout io.Writer) error {
	for i := 1; i <= 4; i++ {
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "request %d: %s\n", i, resp.Status)
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if v := resp.Header.Get(name); v != "" {
				fmt.Fprintf(stdout, "  %s: %s\n", name, v)
			}
		}
		fmt.Fprintf(stdout, "  %s\n", strings.TrimSpace(string(body)))
	}
	return nil
}
