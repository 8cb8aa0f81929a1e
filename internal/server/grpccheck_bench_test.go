package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/checkpb"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// BenchmarkCheckServerCPU measures the server CPU time of a check, read
// from /proc for a sluice serve process (memory store, a gcra policy
// never reached, 10 000 subjects), in one run: single checks from 64
// callers over POST /v1/check (HTTP/1.1 keep-alive, a connection each),
// and 64 callers sharing one gRPC CheckStream. It reports
// server-µs/check; the client's CPU is this process's, not counted.
//
//	go test -run '^$' -bench CheckServerCPU -benchtime 5s ./internal/server
func BenchmarkCheckServerCPU(b *testing.B) {
	ctx := context.Background()
	root, err := servetest.Root(ctx)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	bin, err := servetest.Build(ctx, root, dir, []string{"CGO_ENABLED=0"}, "-trimpath")
	if err != nil {
		b.Fatal(err)
	}
	writeTree(b, dir, map[string]string{"sluice.yaml": `server: { listen: "127.0.0.1:0" }
policies:
  - { id: open, algorithm: gcra, limit: 1000000000, window: 1s }
envoy:
  listen: "127.0.0.1:0"
  configs: ["rules/*.yaml"]
`, "rules/shop.yaml": rulesFile(5)})
	p, err := servetest.Start(bin, servetest.Options{Timeout: time.Minute}, "serve", "-c", filepath.Join(dir, "sluice.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Stop(15 * time.Second)
	subjects := make([]string, 10_000)
	for i := range subjects {
		subjects[i] = "user-" + strconv.Itoa(i)
	}
	b.Run("http-single-64", func(b *testing.B) { benchHTTPChecks(b, p.PID(), p.URL, subjects) })
	b.Run("grpc-stream-64", func(b *testing.B) { benchStreamChecks(b, p.PID(), p.RLSAddr(), subjects) })
}

// serverCPU returns process pid's user + system CPU time, from /proc.
func serverCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("server CPU is read from /proc: %v", err)
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:])) // f[0] is field 3
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond // clock ticks of 10ms
}

// measured runs work from 64 callers (RunParallel on 2 cores: 32 each)
// and reports the server's CPU per check.
func measured(b *testing.B, pid int, work func(pb *testing.PB, caller int)) {
	b.ReportAllocs()
	b.SetParallelism(64 / runtime.GOMAXPROCS(0))
	var callers atomic.Int64
	before := serverCPU(b, pid)
	b.RunParallel(func(pb *testing.PB) { work(pb, int(callers.Add(1)-1)) })
	b.ReportMetric(float64((serverCPU(b, pid)-before).Microseconds())/float64(b.N), "server-µs/check")
}

func benchHTTPChecks(b *testing.B, pid int, url string, subjects []string) {
	tr := &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 128, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	measured(b, pid, func(pb *testing.PB, caller int) {
		for i := caller * 131; pb.Next(); i++ {
			body := `{"policy":"open","subject":"` + subjects[i%len(subjects)] + `"}`
			resp, err := client.Post(url+"/v1/check", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("POST /v1/check: %s", resp.Status)
				return
			}
		}
	})
}

func benchStreamChecks(b *testing.B, pid int, addr string, subjects []string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := checkpb.NewCheckServiceClient(conn).CheckStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// Each caller has an id and a channel its answers come back on.
	const callers = 256 // more than RunParallel starts
	answers := make([]chan *checkpb.CheckResponse, callers)
	for i := range answers {
		answers[i] = make(chan *checkpb.CheckResponse, 1)
	}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			k, _ := strconv.Atoi(resp.Id)
			answers[k] <- resp
		}
	}()
	var sendMu sync.Mutex
	measured(b, pid, func(pb *testing.PB, caller int) {
		id := strconv.Itoa(caller)
		for i := caller * 131; pb.Next(); i++ {
			sendMu.Lock()
			err := stream.Send(&checkpb.CheckRequest{Id: id, Policy: "open", Subject: subjects[i%len(subjects)]})
			sendMu.Unlock()
			if err != nil {
				b.Error(err)
				return
			}
			if resp := <-answers[caller]; resp.HttpStatus != http.StatusOK {
				b.Errorf("CheckStream: %v", resp)
				return
			}
		}
	})
}
