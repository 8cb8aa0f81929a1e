package server_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/subject"
)

// BenchmarkCheckAPI measures POST /v1/check over a real socket, HTTP/1.1
// keep-alive, wired as sluice serve wires it (memstore timed by the
// metrics, an HMAC pseudonymizer, request logs at info), on 10 000
// subjects: serially and from 16 callers. Its CPU profile says where a
// check's server time goes:
//
//	go test -run '^$' -bench CheckAPI/parallel -cpuprofile cpu.out ./internal/server
//	go tool pprof -top -cum -focus 'net/http.\(\*conn\).serve' cpu.out
func BenchmarkCheckAPI(b *testing.B) {
	m, err := server.NewMetrics(prometheus.NewRegistry(), []string{"open"})
	if err != nil {
		b.Fatal(err)
	}
	lim, err := sluice.New(m.InstrumentStore(memstoreFor(b), "memory", clock.System{}),
		[]sluice.Policy{{ID: "open", Algorithm: sluice.GCRA, Limit: 1_000_000_000, Window: time.Second}}, sluice.Options{})
	if err != nil {
		b.Fatal(err)
	}
	pseud, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := server.New(lim, pseud, slog.New(slog.NewTextHandler(io.Discard, nil)), server.Options{Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	const subjects = 10_000
	bodies := make([][]byte, subjects)
	for i := range bodies {
		bodies[i] = []byte(`{"policy":"open","subject":"user-` + strconv.Itoa(i) + `"}`)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	check := func(b *testing.B, i int) {
		resp, err := client.Post(ts.URL+"/v1/check", "application/json", bytes.NewReader(bodies[i%subjects]))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("POST /v1/check: %s", resp.Status)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			check(b, i)
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8) // 16 callers on 2 cores
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				check(b, i)
				i += 7
			}
		})
	})
}
