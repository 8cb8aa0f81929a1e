package sluiceclient_test

import (
	"log/slog"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/subject"
)

// runningServer stands in for a running `sluice serve` whose config has a
// policy "demo" of 3 per hour and a token "app-secret-0123456789" with
// the check scope. It returns the server's URL and a function that stops
// it.
func runningServer() (string, func()) {
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	lim, err := sluice.New(ms, []sluice.Policy{{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour}}, sluice.Options{})
	if err != nil {
		panic(err)
	}
	api, err := server.New(lim, subject.Unkeyed(), slog.New(slog.DiscardHandler), server.Options{
		Tokens: []server.Token{{ID: "app", Secret: []byte("app-secret-0123456789"), Scopes: []string{"check"}}},
	})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(api)
	return ts.URL, func() { ts.Close(); ms.Close() }
}
