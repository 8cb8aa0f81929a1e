package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bench/internal/proc"
	"github.com/sluicehq/sluice/internal/testkit/servetest"
)

// answer is one check as the caller saw it.
type answer struct {
	subject    int32
	status     int16 // 0: no answer (a transport error)
	sent, recv time.Duration
	remaining  int32 // of a 200
	resetAfter int32 // ms, of a 200
}

// sample is one report of the server's state.
type sample struct {
	at         time.Duration
	rss, peak  int64
	goroutines float64
}

// results is everything a run measured.
type results struct {
	start    time.Time
	took     time.Duration
	answers  []answer
	faults   []fault
	samples  []sample
	idle     sample // after the load stopped and 2 s went by
	panics   []string
	errs     []string // what the fault rotation could not do
	baseline float64  // goroutines before the load
}

// soak runs the load, the faults and the reports until o.duration is over.
func soak(ctx context.Context, o *options, r *rig, sv *servetest.Process, stderr io.Writer) (*results, error) {
	res := &results{}
	tr := &http.Transport{MaxIdleConnsPerHost: o.callers + 2, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	if m, err := proc.Scrape(ctx, client, sv.URL); err == nil {
		res.baseline, _ = m.Sum("go_goroutines")
	}
	start := time.Now()
	res.start = start
	ctx, cancel := context.WithDeadline(ctx, start.Add(o.duration))
	defer cancel()
	var classes counts
	var wg sync.WaitGroup
	answers := make([][]answer, o.callers)
	for c := range o.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[c] = load(ctx, client, sv.URL, o, c, start, &classes)
		}()
	}
	reported := make(chan []sample, 1)
	go func() { reported <- reportLoop(ctx, client, sv, o, start, &classes, stderr) }()
	res.faults, res.errs = faultLoop(ctx, r, o, start, stderr)
	wg.Wait()
	res.took = time.Since(start)
	res.samples = <-reported
	for _, a := range answers {
		res.answers = append(res.answers, a...)
	}
	time.Sleep(2 * time.Second)
	res.idle = read(context.Background(), client, sv, res.took)
	return res, nil
}

// faultLoop applies a fault every o.every, in rotation, until ctx ends.
func faultLoop(ctx context.Context, r *rig, o *options, start time.Time, stderr io.Writer) ([]fault, []string) {
	var faults []fault
	var errs []string
	for k := 1; ; k++ {
		at := start.Add(time.Duration(k) * o.every)
		select {
		case <-ctx.Done():
			return faults, errs
		case <-time.After(time.Until(at)):
		}
		if deadline, _ := ctx.Deadline(); at.Add(o.hold).After(deadline) {
			return faults, errs // no time left to hold and heal it under load
		}
		name := faultNames[(k-1)%len(faultNames)]
		f, err := r.apply(ctx, name)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s at %s: %v", name, time.Since(start).Round(time.Second), err))
			fmt.Fprintf(stderr, "fault %s failed: %v\n", name, err)
			continue
		}
		faults = append(faults, f)
		fmt.Fprintf(stderr, "%6.0fs  fault %-8s %s (held %s)\n", f.start.Sub(start).Seconds(), name, f.note, f.heal.Sub(f.start).Round(time.Millisecond))
	}
}

// counts are the answers so far by class, for the reports.
type counts struct{ ok, denied, unavailable, server, other, failed atomic.Int64 }

func (c *counts) add(status int) {
	switch status {
	case http.StatusOK:
		c.ok.Add(1)
	case http.StatusTooManyRequests:
		c.denied.Add(1)
	case http.StatusServiceUnavailable:
		c.unavailable.Add(1)
	case http.StatusInternalServerError:
		c.server.Add(1)
	case 0:
		c.failed.Add(1)
	default:
		c.other.Add(1)
	}
}

// load is caller c: a check every o.interval (ticks missed while waiting
// for an answer are dropped) on the subjects in turn, until ctx ends.
func load(ctx context.Context, client *http.Client, base string, o *options, c int, start time.Time, classes *counts) []answer {
	var out []answer
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for i := c; ; i += o.callers {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		a := answer{subject: int32(i % o.subjects), sent: time.Since(start)}
		status, remaining, reset, err := check(ctx, client, base, fmt.Sprintf("soak-%d", a.subject))
		a.recv = time.Since(start)
		if err != nil && ctx.Err() != nil {
			return out // cut by the end of the run: no answer to count
		}
		if err == nil {
			a.status, a.remaining, a.resetAfter = int16(status), int32(remaining), int32(reset)
		}
		classes.add(int(a.status))
		out = append(out, a)
	}
}

// check asks POST /v1/check for one unit of policy soak for subject.
func check(ctx context.Context, client *http.Client, base, subject string) (status int, remaining, resetAfterMS int64, err error) {
	body := []byte(`{"policy":"soak","subject":"` + subject + `"}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return 0, 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, 0, err
	}
	var a struct {
		Remaining    int64 `json:"remaining"`
		ResetAfterMS int64 `json:"reset_after_ms"`
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &a); err != nil {
			return 0, 0, 0, fmt.Errorf("200 with %q: %w", b, err)
		}
	}
	return resp.StatusCode, a.Remaining, a.ResetAfterMS, nil
}

// reportLoop prints the server's memory and goroutines, and the answers
// of the last period, every o.report until ctx ends.
func reportLoop(ctx context.Context, client *http.Client, sv *servetest.Process, o *options, start time.Time, c *counts, stderr io.Writer) []sample {
	var out []sample
	tick := time.NewTicker(o.report)
	defer tick.Stop()
	var last [6]int64
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		s := read(context.Background(), client, sv, time.Since(start)) // ctx may end meanwhile
		out = append(out, s)
		now := [6]int64{c.ok.Load(), c.denied.Load(), c.unavailable.Load(), c.server.Load(), c.other.Load(), c.failed.Load()}
		fmt.Fprintf(stderr, "%6.0fs  RSS %3d MiB (peak %3d)  goroutines %3.0f  last %s: 200 %5d  429 %5d  503 %4d  500 %d  other %d  no answer %d\n",
			s.at.Seconds(), s.rss>>20, s.peak>>20, s.goroutines, o.report,
			now[0]-last[0], now[1]-last[1], now[2]-last[2], now[3]-last[3], now[4]-last[4], now[5]-last[5])
		last = now
	}
}

// read samples the server's memory (/proc) and goroutines (/metrics);
// what it cannot read stays 0 (-1 goroutines).
func read(ctx context.Context, client *http.Client, sv *servetest.Process, at time.Duration) sample {
	s := sample{at: at, goroutines: -1}
	if m, err := proc.ReadMemory(sv.PID()); err == nil {
		s.rss, s.peak = m.RSS, m.Peak
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if m, err := proc.Scrape(ctx, client, sv.URL); err == nil {
		if g, ok := m.Sum("go_goroutines"); ok {
			s.goroutines = g
		}
	}
	return s
}
