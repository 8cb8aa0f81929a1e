package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// printReport prints the run's figures in markdown.
func printReport(w io.Writer, o *options, res *results) {
	var total counts
	for _, a := range res.answers {
		total.add(int(a.status))
	}
	fmt.Fprintf(w, "\n## soak: %s, %d callers (one check each per %s), %d subjects, fixed_window %d per %s, on redisstore\n\n",
		res.took.Round(time.Second), o.callers, o.interval, o.subjects, o.limit, window)
	fmt.Fprintf(w, "answers: %d; 200 %d, 429 %d, 503 %d, 500 %d, other %d, no answer %d\n",
		len(res.answers), total.ok.Load(), total.denied.Load(), total.unavailable.Load(), total.server.Load(), total.other.Load(), total.failed.Load())
	fmt.Fprintf(w, "panics in the server's stderr: %d\n", len(res.panics))
	for _, p := range res.panics[:min(len(res.panics), 5)] {
		fmt.Fprintf(w, "  %s\n", p)
	}
	for _, e := range res.errs {
		fmt.Fprintf(w, "fault not applied: %s\n", e)
	}
	printFaults(w, res)
	printSamples(w, res)
	printExactness(w, o, res)
}

// printFaults prints one row per fault: the answers from its start to
// the next fault, and how soon after the heal the last failed answer
// that started after it ended (before the next fault began).
func printFaults(w io.Writer, res *results) {
	fmt.Fprintln(w, "\n| at | fault | what | held | 200 / 429 / 503 / other until the next fault | recovered after the heal |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for i, f := range res.faults {
		from, heal := f.start.Sub(res.start), f.heal.Sub(res.start)
		until := res.took
		if i+1 < len(res.faults) {
			until = res.faults[i+1].start.Sub(res.start)
		}
		var c counts
		var recovered time.Duration
		for _, a := range res.answers {
			if a.sent < from || a.sent >= until {
				continue
			}
			c.add(int(a.status))
			if failed(a) && a.sent >= heal && a.recv < until {
				recovered = max(recovered, a.recv-heal)
			}
		}
		fmt.Fprintf(w, "| %.0fs | %s | %s | %s | %d / %d / %d / %d | %s |\n", from.Seconds(), f.name, f.note,
			f.heal.Sub(f.start).Round(time.Millisecond), c.ok.Load(), c.denied.Load(), c.unavailable.Load(),
			c.server.Load()+c.other.Load()+c.failed.Load(), recovered.Round(time.Millisecond))
	}
}

// failed reports whether a is neither an admission nor a denial.
func failed(a answer) bool {
	return a.status != http.StatusOK && a.status != http.StatusTooManyRequests
}

// printSamples prints the server's memory and goroutines over the run.
func printSamples(w io.Writer, res *results) {
	if len(res.samples) == 0 {
		return
	}
	var rss, gor []string
	lo, hi := res.samples[0], res.samples[0]
	for _, s := range res.samples {
		rss = append(rss, fmt.Sprint(s.rss>>20))
		gor = append(gor, fmt.Sprint(s.goroutines))
		if s.rss < lo.rss {
			lo = s
		}
		if s.rss > hi.rss {
			hi = s
		}
	}
	first, last := res.samples[0], res.samples[len(res.samples)-1]
	fmt.Fprintf(w, "\nserver RSS (VmRSS) every report, MiB: %s\n", strings.Join(rss, " "))
	fmt.Fprintf(w, "goroutines (go_goroutines) every report: %s\n", strings.Join(gor, " "))
	fmt.Fprintf(w, "RSS first %d MiB (at %.0fs), lowest %d, highest %d (at %.0fs), last %d; peak (VmHWM) %d MiB\n",
		first.rss>>20, first.at.Seconds(), lo.rss>>20, hi.rss>>20, hi.at.Seconds(), last.rss>>20, res.idle.peak>>20)
	fmt.Fprintf(w, "goroutines before the load %.0f, 2 s after it stopped %.0f; RSS then %d MiB\n", res.baseline, res.idle.goroutines, res.idle.rss>>20)
}

// admission is a 200 with the end of its window, estimated as the middle
// of its round trip plus reset_after_ms.
type admission struct {
	end       time.Duration
	remaining int32
}

// exactness is what the admissions tell of the limit.
type exactness struct {
	windows, most int      // windows with admissions, the most admitted in one
	over, twice   int      // admitted beyond a limit, windows with a remaining count seen twice
	worst         []string // the first such windows
}

// checkExactness groups each subject's admissions by the end of their
// window and counts those of groups holding more than limit, or the same
// remaining count twice. Windows of one subject end at least one window
// apart, and the estimate is off by at most half a round trip, so ends
// within half a window of a group's first are the same window.
func checkExactness(answers []answer, subjects, limit int) exactness {
	per := make([][]admission, subjects)
	for _, a := range answers {
		if a.status == http.StatusOK {
			end := (a.sent+a.recv)/2 + time.Duration(a.resetAfter)*time.Millisecond
			per[a.subject] = append(per[a.subject], admission{end, a.remaining})
		}
	}
	var x exactness
	for s, adm := range per {
		slices.SortFunc(adm, func(a, b admission) int { return int(a.end - b.end) })
		for i := 0; i < len(adm); {
			j, seen, dup := i, map[int32]bool{}, false
			for ; j < len(adm) && adm[j].end-adm[i].end < window/2; j++ {
				dup = dup || seen[adm[j].remaining]
				seen[adm[j].remaining] = true
			}
			x.windows++
			x.most = max(x.most, j-i)
			if j-i > limit || dup {
				x.over += max(j-i-limit, 0)
				if dup {
					x.twice++
				}
				if len(x.worst) < 10 {
					x.worst = append(x.worst, fmt.Sprintf("soak-%d: %d admitted in the window ending at %.1fs", s, j-i, adm[i].end.Seconds()))
				}
			}
			i = j
		}
	}
	return x
}

func printExactness(w io.Writer, o *options, res *results) {
	x := checkExactness(res.answers, o.subjects, o.limit)
	fmt.Fprintf(w, "\nexactness: %d windows with admissions, at most %d admitted in one (limit %d); %d admitted beyond a limit, %d windows with a remaining count seen twice\n",
		x.windows, x.most, o.limit, x.over, x.twice)
	for _, s := range x.worst {
		fmt.Fprintf(w, "  %s\n", s)
	}
}
