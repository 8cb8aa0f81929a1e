package sluiceclient_test

import (
	"log/slog"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluiceclient"
	"github.com/sluicehq/sluice/subject"
)

// runningServer stands in for a running `sluice serve` whose config has a
// policy "demo" of 3 per hour, a policy "reports" of 2 at once and a
// token "app-secret-0123456789" with every scope but admin. It returns the server's URL and a function that stops
// it.
func runningServer() (string, func()) {
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	lim, err := sluice.New(ms, []sluice.Policy{
		{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour},
		{ID: "reports", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: time.Hour},
	}, sluice.Options{})
	if err != nil {
		panic(err)
	}
	api, err := server.New(lim, subject.Unkeyed(), slog.New(slog.DiscardHandler), server.Options{
		Tokens: []server.Token{{ID: "app", Secret: []byte("app-secret-0123456789"), Scopes: []string{"check", "refund", "reset"}}},
	})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(api)
	return ts.URL, func() { ts.Close(); ms.Close() }
}

// clientOfRunningServer returns a Client of runningServer with its token,
// and a function that closes both.
func clientOfRunningServer() (*sluiceclient.Client, func()) {
	url, stop := runningServer()
	client, err := sluiceclient.New(url, sluiceclient.Options{Token: "app-secret-0123456789"})
	if err != nil {
		panic(err)
	}
	return client, func() { client.Close(); stop() }
}
