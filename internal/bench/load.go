package bench

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice"
)

// Latencies go into a histogram: exact below 64 ns, then 32 buckets per
// power of two (about 3 % wide) up to 2^40 ns.
const benchBuckets = 64 + 35*32

type latencies [benchBuckets]uint64

// add counts d. Its atomic add lets the progress line read the
// histogram while the caller runs.
func (h *latencies) add(d time.Duration) {
	ns := int64(d)
	if ns < 64 {
		atomic.AddUint64(&h[max(ns, 0)], 1)
		return
	}
	e := bits.Len64(uint64(ns)) - 6
	atomic.AddUint64(&h[min(64+(e-1)*32+int(ns>>e)-32, benchBuckets-1)], 1)
}

// merge adds what o holds now to h.
func (h *latencies) merge(o *latencies) {
	for i := range o {
		h[i] += atomic.LoadUint64(&o[i])
	}
}

// quantile returns the q-quantile in ms, from the middle of its bucket.
func (h *latencies) quantile(q float64) float64 {
	var total uint64
	for _, n := range h {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank, seen := uint64(q*float64(total-1))+1, uint64(0)
	for i, n := range h {
		if seen += n; seen < rank {
			continue
		}
		if i < 64 {
			return float64(i) / 1e6
		}
		e := (i-64)/32 + 1
		m := int64((i-64)%32 + 32)
		return (float64(m<<e) + float64(int64(1)<<e)/2) / 1e6
	}
	return 0
}

// benchCaller is one caller's tally; done is read by the progress line
// while the caller runs (the histogram keeps neighbouring callers' done
// counters on different cache lines).
type benchCaller struct {
	done, errs      atomic.Int64
	allowed, denied int64
	other           map[string]int64
	firstErr        error
	lat             latencies
}

type benchResult struct {
	elapsed   time.Duration
	callers   []benchCaller
	allErrors bool // stopped early: the first benchAllErrors answers were all errors
}

// benchAllErrors is how many answers, all of them errors, stop a run
// early: it cannot measure anything (a misspelled policy, a missing
// token), and each error costs the server a log line.
const benchAllErrors = 100

// benchLoad runs callers goroutines against decide for dur (or until ctx
// is done), each on subjects picked at random, reporting progress on
// stderr. A decision in flight when dur ends is waited for and counted;
// one cut short by ctx is not.
func benchLoad(ctx context.Context, progress io.Writer, decide benchDecider, subjects []string, callers int, dur time.Duration) *benchResult {
	var stop atomic.Bool
	timer := time.AfterFunc(dur, func() { stop.Store(true) })
	defer timer.Stop()
	res := &benchResult{callers: make([]benchCaller, callers)}
	var answers, decisions atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := range res.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bc := &res.callers[c]
			bc.other = map[string]int64{}
			rng := uint64(c+1) * 0x9E3779B97F4A7C15
			for !stop.Load() && ctx.Err() == nil {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				subj := subjects[rng%uint64(len(subjects))]
				t0 := time.Now()
				kind, err := decide(ctx, subj)
				d := time.Since(t0)
				if ctx.Err() != nil && kind != sluice.Allowed && kind != sluice.Denied {
					break // cut short by an interrupt: not a result
				}
				bc.lat.add(d)
				switch kind {
				case sluice.Allowed:
					bc.allowed++
					decisions.Add(1)
				case sluice.Denied:
					bc.denied++
					decisions.Add(1)
				default:
					name := "error"
					if kind != 0 {
						name = kind.String()
					}
					bc.other[name]++
					bc.errs.Add(1)
					if bc.firstErr == nil {
						bc.firstErr = err
					}
				}
				bc.done.Add(1)
				if answers.Add(1) >= benchAllErrors && decisions.Load() == 0 && !stop.Swap(true) {
					res.allErrors = true // nothing to measure: stop now
				}
			}
		}()
	}
	stopProgress := showProgress(progress, res, start, dur)
	wg.Wait()
	res.elapsed = time.Since(start)
	stopProgress()
	return res
}

// progress draws a bar on stderr when it is a terminal, else writes a
// plain line every 5 s (every second for runs under 10 s). The returned
// func stops it.
func showProgress(w io.Writer, res *benchResult, start time.Time, dur time.Duration) func() {
	tty := isTerminal(w)
	every := 5 * time.Second
	switch {
	case tty:
		every = 200 * time.Millisecond
	case dur < 10*time.Second:
		every = time.Second
	}
	count := func() (n, errs int64, p99 float64) {
		var lat latencies
		for i := range res.callers {
			n += res.callers[i].done.Load()
			errs += res.callers[i].errs.Load()
			lat.merge(&res.callers[i].lat)
		}
		return n, errs, lat.quantile(0.99)
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				if tty {
					io.WriteString(w, "\r\033[K")
				}
				return
			case <-t.C:
			}
			el := time.Since(start)
			n, errs, p99 := count()
			rate := float64(n) / el.Seconds()
			left := max(dur-el, 0).Round(time.Second)
			if tty {
				frac := min(el.Seconds()/dur.Seconds(), 1)
				const width = 30
				full := int(frac * width)
				fmt.Fprintf(w, "\r\033[K[%s%s] %3.0f%%  %.0f decisions/s  p99 %s  %s errors  %s left", strings.Repeat("=", full), strings.Repeat(" ", width-full), frac*100, rate, fmtMS(p99), fmtCount(errs), left)
			} else {
				fmt.Fprintf(w, "sluice bench: %s of %s, %d answers, %.0f/s, p99 %s, %d errors, %s left\n", el.Round(time.Second/10), dur, n, rate, fmtMS(p99), errs, left)
			}
		}
	}()
	return func() { close(stop); <-finished }
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func fmtCount(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (r *benchResult) fill(rep *Report) {
	rep.StoppedEarly = r.allErrors
	var lat latencies
	for i := range r.callers {
		c := &r.callers[i]
		rep.Allowed += c.allowed
		rep.Denied += c.denied
		for k, n := range c.other {
			if rep.OtherKinds == nil {
				rep.OtherKinds = map[string]int64{}
			}
			rep.OtherKinds[k] += n
			rep.Other += n
		}
		if rep.FirstError == "" && c.firstErr != nil {
			rep.FirstError = c.firstErr.Error()
		}
		lat.merge(&c.lat)
	}
	rep.Seconds = r.elapsed.Seconds()
	rep.Decisions = rep.Allowed + rep.Denied
	rep.PerSecond = float64(rep.Decisions) / rep.Seconds
	rep.P50, rep.P99, rep.P999 = lat.quantile(0.5), lat.quantile(0.99), lat.quantile(0.999)
}

func (rep *Report) writeTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("target", rep.Target)
	row("mode", rep.Mode)
	if rep.Algorithm != "" {
		burst := ""
		if rep.Algorithm == "token_bucket" || rep.Algorithm == "gcra" {
			burst = fmt.Sprintf(", burst %d", rep.Burst)
		}
		row("policy", fmt.Sprintf("%s: %s, %d per %s%s", rep.Policy, rep.Algorithm, rep.Limit, rep.Window, burst))
	} else {
		row("policy", rep.Policy+" (as the server configures it)")
	}
	row("callers", fmt.Sprint(rep.Callers))
	row("subjects", fmt.Sprint(rep.Subjects))
	row("duration", fmt.Sprintf("%.2fs", rep.Seconds))
	row("decisions/s", fmt.Sprintf("%.0f", rep.PerSecond))
	row("allowed", fmt.Sprint(rep.Allowed))
	row("denied", fmt.Sprint(rep.Denied))
	other := fmt.Sprint(rep.Other)
	if rep.Other > 0 {
		var parts []string
		for k, n := range rep.OtherKinds {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
		other += " (" + strings.Join(parts, ", ") + ")"
	}
	row("other", other)
	row("p50", fmtMS(rep.P50))
	row("p99", fmtMS(rep.P99))
	row("p99.9", fmtMS(rep.P999))
	if rep.KeysDeleted > 0 {
		row("redis keys deleted", fmt.Sprint(rep.KeysDeleted))
	}
	tw.Flush()
	if rep.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", rep.FirstError)
	}
}

func fmtMS(ms float64) string {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Microsecond / 10).String()
}
