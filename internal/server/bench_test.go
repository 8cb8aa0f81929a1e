package server_test

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
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
	srv := benchServer(b)
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

// benchServer is the check API as sluice serve wires it, over memstore
// with a policy never reached.
func benchServer(b *testing.B) *server.Server {
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
	return srv
}

// BenchmarkCheckAPITCP is BenchmarkCheckAPI driven over plain
// keep-alive TCP, each request encoded once, so that its profile is the
// server's alone (net/http's client costs as much CPU as the server):
//
//	go test -run '^$' -bench CheckAPITCP -cpuprofile cpu.out ./internal/server
//	go tool pprof -top -cum -focus 'net/http.\(\*conn\).serve' cpu.out
func BenchmarkCheckAPITCP(b *testing.B) {
	srv := benchServer(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(ln)
	defer hs.Close()
	const subjects = 10_000
	reqs := make([][]byte, subjects)
	for i := range reqs {
		body := `{"policy":"open","subject":"user-` + strconv.Itoa(i) + `"}`
		reqs[i] = []byte("POST /v1/check HTTP/1.1\r\nHost: " + ln.Addr().String() + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	}
	b.ReportAllocs()
	b.SetParallelism(8) // 16 callers on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		i := 0
		for pb.Next() {
			if _, err := c.Write(reqs[i%subjects]); err != nil {
				b.Error(err)
				return
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				b.Errorf("POST /v1/check: %s", resp.Status)
				return
			}
			i += 7
		}
	})
}

// BenchmarkChecksAPITCP is BenchmarkCheckAPITCP for POST /v1/checks, 16
// checks a request, reported per check: its profile is the batch path's
// server side alone.
//
//	go test -run '^$' -bench ChecksAPITCP -cpuprofile cpu.out ./internal/server
//	go tool pprof -top -cum -focus 'net/http.\(\*conn\).serve' cpu.out
func BenchmarkChecksAPITCP(b *testing.B) {
	srv := benchServer(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(ln)
	defer hs.Close()
	const subjects, per = 10_000, 16
	reqs := make([][]byte, subjects/per)
	for i := range reqs {
		body := []byte(`{"checks":[`)
		for j := range per {
			if j > 0 {
				body = append(body, ',')
			}
			body = append(body, `{"policy":"open","subject":"user-`+strconv.Itoa(i*per+j)+`"}`...)
		}
		body = append(body, "]}"...)
		reqs[i] = []byte("POST /v1/checks HTTP/1.1\r\nHost: " + ln.Addr().String() + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
	}
	b.ReportAllocs()
	b.SetParallelism(8) // 16 callers on 2 cores
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		i := int(n.Add(131))
		for pb.Next() {
			if _, err := c.Write(reqs[i%len(reqs)]); err != nil {
				b.Error(err)
				return
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				b.Errorf("POST /v1/checks: %s", resp.Status)
				return
			}
			i++
		}
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*per), "ns/check")
}
