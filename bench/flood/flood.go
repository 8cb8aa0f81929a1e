package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bench/internal/proc"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// result is what one run measured.
type result struct {
	name               string
	took               time.Duration
	answers            map[int]int64 // HTTP status → count
	errors             int64         // requests that got no answer
	peak, end, maxRSS  int64         // bytes: VmHWM at the end, VmRSS at the end, the largest VmRSS sampled
	heap               float64       // go_memstats_heap_inuse_bytes at the end
	evictions, lostIDs float64       // sluice_store_evictions_total, sluice_store_evicted_ids_total
	goroutines         float64       // go_goroutines at the end
	peeked, peekedHeld int           // subjects sampled at the end, and those whose state was still held
	peekErrors         int
}

// subject is the i-th subject: 43 bytes, a pseudonym's length.
func subject(i int) string { return fmt.Sprintf("k1:%040d", i) }

// flood starts a server, sends o.subjects distinct subjects through it
// (with an evaluation_id each when ids), samples its memory meanwhile and
// reads its metrics and a sample of peeks at the end.
func flood(ctx context.Context, o *options, bin, config, logPath string, ids bool, stderr io.Writer) (result, error) {
	r := result{answers: map[int]int64{}}
	sv, err := servetest.Start(bin, servetest.Options{LogPath: logPath, Timeout: 30 * time.Second}, "serve", "-c", config)
	if err != nil {
		return r, err
	}
	defer sv.Stop(15 * time.Second)
	tr := &http.Transport{MaxIdleConnsPerHost: o.callers + 1, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var sent atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan int64, 1)
	start := time.Now()
	go func() { sampled <- sample(sv.PID(), o, &sent, start, stop, stderr) }()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var next atomic.Int64
	for range o.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local, failed := map[int]int64{}, int64(0)
			for i := int(next.Add(1) - 1); i < o.subjects && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				id := ""
				if ids {
					id = fmt.Sprintf("%036d", i) // a UUID's length
				}
				status, _, err := check(ctx, client, sv.URL, subject(i), 1, id)
				if err != nil {
					failed++
				} else {
					local[status]++
				}
				sent.Add(1)
			}
			mu.Lock()
			defer mu.Unlock()
			r.errors += failed
			for k, v := range local {
				r.answers[k] += v
			}
		}()
	}
	wg.Wait()
	r.took = time.Since(start)
	close(stop)
	r.maxRSS = <-sampled
	if err := ctx.Err(); err != nil {
		return r, err
	}
	return r, finish(ctx, &r, o, sv, client)
}

// finish reads the server's memory and metrics after the flood, then
// peeks at a sample of the subjects sent.
func finish(ctx context.Context, r *result, o *options, sv *servetest.Process, client *http.Client) error {
	mem, err := proc.ReadMemory(sv.PID())
	if err != nil {
		return err
	}
	r.peak, r.end = mem.Peak, mem.RSS
	m, err := proc.Scrape(ctx, client, sv.URL)
	if err != nil {
		return err
	}
	r.heap, _ = m.Sum("go_memstats_heap_inuse_bytes")
	r.evictions, _ = m.Sum("sluice_store_evictions_total")
	r.lostIDs, _ = m.Sum("sluice_store_evicted_ids_total")
	r.goroutines, _ = m.Sum("go_goroutines")
	for j := range min(o.peeks, o.subjects) {
		i := int(int64(j) * int64(o.subjects) / int64(min(o.peeks, o.subjects)))
		status, remaining, err := check(ctx, client, sv.URL, subject(i), 0, "")
		switch {
		case err != nil || status != http.StatusOK:
			r.peekErrors++
		case remaining < 100: // its one request is still held
			r.peekedHeld++
		}
		r.peeked++
	}
	return nil
}

// sample reads pid's memory every second until stop, printing progress
// every o.every, and returns the largest VmRSS it saw.
func sample(pid int, o *options, sent *atomic.Int64, start time.Time, stop <-chan struct{}, stderr io.Writer) int64 {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var most int64
	last := time.Now()
	for {
		select {
		case <-stop:
			return most
		case <-tick.C:
		}
		mem, err := proc.ReadMemory(pid)
		if err != nil {
			continue
		}
		most = max(most, mem.RSS)
		if time.Since(last) >= o.every {
			last = time.Now()
			n := sent.Load()
			fmt.Fprintf(stderr, "%6.0fs  %9d sent (%5.0f/s)  RSS %4d MiB  peak %4d MiB\n",
				time.Since(start).Seconds(), n, float64(n)/time.Since(start).Seconds(), mem.RSS>>20, mem.Peak>>20)
		}
	}
}

// check sends one POST /v1/check for subject to policy api, spending cost
// (0: a peek), with evaluation id id unless empty, and returns the status
// and the remaining count of the answer.
func check(ctx context.Context, client *http.Client, base, subject string, cost int, id string) (int, int64, error) {
	body := `{"policy":"api","subject":"` + subject + `","cost":` + strconv.Itoa(cost)
	if id != "" {
		body += `,"evaluation_id":"` + id + `"`
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/check", bytes.NewReader([]byte(body+"}")))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var answer struct {
		Remaining int64 `json:"remaining"`
	}
	b, err := io.ReadAll(resp.Body)
	if err == nil && cost == 0 {
		err = json.Unmarshal(b, &answer)
	}
	return resp.StatusCode, answer.Remaining, err
}

// printResults prints one markdown row per run.
func printResults(w io.Writer, o *options, rs []result) {
	fmt.Fprintf(w, "\n%d distinct subjects per run, %d callers, gcra 100/24h on the embedded store (MaxKeys 1 000 000)\n\n", o.subjects, o.callers)
	fmt.Fprintln(w, "| run | took | checks/s | peak RSS (VmHWM) | largest VmRSS sampled | RSS at the end | heap in use (Go) | evictions (states) | evicted ids | states held (sent − evicted) | peeks still held | goroutines | answers |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		held := "–"
		if r.peeked > 0 {
			held = fmt.Sprintf("%d of %d (≈ %.0f)", r.peekedHeld, r.peeked, float64(r.peekedHeld)/float64(r.peeked)*float64(o.subjects))
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %d MiB | %d MiB | %d MiB | %.0f MiB | %.0f | %.0f | %.0f | %s | %.0f | %v, %d errors, %d peek errors |\n",
			r.name, r.took.Round(time.Second), float64(o.subjects)/r.took.Seconds(), r.peak>>20, r.maxRSS>>20, r.end>>20, r.heap/(1<<20),
			r.evictions, r.lostIDs, float64(o.subjects)-r.evictions, held, r.goroutines, r.answers, r.errors, r.peekErrors)
	}
}
