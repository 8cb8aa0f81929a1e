package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/subject"
)

// benchHandler is the middleware over a memstore, called without sockets
// so the numbers are the middleware's own.
func benchHandler(b *testing.B) http.Handler {
	b.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	l, err := sluice.New(st, []sluice.Policy{{ID: "api", Algorithm: sluice.GCRA, Limit: 1_000_000_000, Window: time.Second}}, sluice.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ips, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		b.Fatal(err)
	}
	key, err := subject.Header("X-API-Key")
	if err != nil {
		b.Fatal(err)
	}
	m, err := httplimit.New(l, httplimit.Options{
		Routes:  []httplimit.Route{{PathPrefix: "/api", Policies: []string{"api"}}},
		Subject: subject.FirstOf(key, subject.ClientIP(ips)),
	})
	if err != nil {
		b.Fatal(err)
	}
	return m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
}

func benchRequest() *http.Request {
	r := httptest.NewRequest("GET", "/api/items", nil)
	r.RemoteAddr = "10.0.0.1:5555"
	r.Header.Set("X-Forwarded-For", "203.0.113.7, 10.0.0.2")
	r.Header.Set("User-Agent", "bench/1.0")
	return r
}

func BenchmarkMiddleware(b *testing.B) {
	h := benchHandler(b)
	r := benchRequest()
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
}

func BenchmarkMiddlewareParallel(b *testing.B) {
	h := benchHandler(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := benchRequest()
		for pb.Next() {
			h.ServeHTTP(httptest.NewRecorder(), r)
		}
	})
}
