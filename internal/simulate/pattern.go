package simulate

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The built-in patterns, by the name --pattern takes.
const (
	Poisson      = "poisson"       // steady Poisson arrivals at Rate, seeded
	Bursts       = "bursts"        // On at Rate, then Off silent, repeated
	Boundary     = "boundary"      // a full limit just before a window edge and just after it
	SlidingWorst = "sliding_worst" // what over-admits most under the sliding window counter
	Ramp         = "ramp"          // a rate rising evenly from 0 to Rate
	Step         = "step"          // a lull at half the limit's rate, then Rate, repeated
)

// Patterns lists the built-in patterns of ACCURACY.md's engine table, in
// the order charts and tables use.
var Patterns = []string{Poisson, Bursts, Boundary, SlidingWorst, Ramp}

// LocalQuotaPatterns lists the patterns of ACCURACY.md's local-quota
// table: Patterns, then Step, the shape in which a block of local quota
// taken while a bucket is full and spent when the flood comes would let
// more through if the store dated it wrong. Every built-in pattern is in
// it.
var LocalQuotaPatterns = []string{Poisson, Bursts, Boundary, SlidingWorst, Ramp, Step}

// PatternSpec describes offered traffic. Its zero fields mean the
// defaults Generate documents, which depend on the limit and window the
// traffic is aimed at.
type PatternSpec struct {
	// Name is one of Patterns.
	Name string
	// Rate is requests per second: Poisson's mean, Bursts' rate while on,
	// Ramp's final rate, Step's rate in a flood. Default: 2 × limit per
	// window for Poisson, 3 × for Bursts and Ramp, 4 × for Step.
	Rate float64
	// Duration is how much virtual time the traffic spans, µs. Default:
	// 30 windows for Poisson (enough requests for its averages to mean
	// something), 3 for Boundary and SlidingWorst, 6 for the others.
	Duration int64
	// On and Off are Bursts' phases, µs. Default: half a window on, one
	// window off.
	On, Off int64
	// Seed makes Poisson and Step arrivals repeatable. Default: 1.
	Seed uint64
	// MaxRequests bounds the requests the pattern may offer, at most
	// the package's MaxRequests. Default: MaxRequests.
	MaxRequests int
}

// MaxDurationWindows bounds PatternSpec.Duration, in windows.
const MaxDurationWindows = 1000

// Epoch returns the virtual start time for traffic aimed at window:
// the first multiple of window at or after 2023-11-14T22:13:20Z, so that
// the sliding window counter's windows (aligned to the epoch) start with
// the traffic.
func Epoch(window int64) int64 {
	const base = 1_700_000_000_000_000
	return (base + window - 1) / window * window
}

// Generate returns the arrivals of ps aimed at a limit per window (µs),
// starting at Epoch(window), and the end of the span they cover. The error
// is an *Error naming the field, value and rule broken.
func Generate(ps PatternSpec, limit, window int64) (arrivals []int64, start, end int64, err error) {
	if limit < 1 || window < 1 {
		return nil, 0, 0, &Error{"limit", fmt.Sprint(limit), "limit and window must be positive"}
	}
	d, err := duration(ps, window)
	if err != nil {
		return nil, 0, 0, err
	}
	rate, err := offeredRate(ps, limit, window)
	if err != nil {
		return nil, 0, 0, err
	}
	most, err := requestBudget(ps, limit, rate, d)
	if err != nil {
		return nil, 0, 0, err
	}
	start = Epoch(window)
	end = start + d
	switch ps.Name {
	case Poisson:
		arrivals = poisson(start, end, rate, cmp.Or(ps.Seed, 1), most)
	case Bursts:
		on, off := cmp.Or(ps.On, window/2), cmp.Or(ps.Off, window)
		if on < 1 || off < 0 {
			return nil, 0, 0, &Error{"on", fmt.Sprint(on), "bursts need on > 0 and off ≥ 0"}
		}
		arrivals = bursts(start, end, rate, on, off, most)
	case Boundary:
		arrivals = boundary(start, window, limit)
	case SlidingWorst:
		arrivals = slidingWorst(start, window, limit)
	case Ramp:
		arrivals = ramp(start, d, rate, most)
	case Step:
		arrivals = step(start, end, window, float64(limit)*1e6/float64(window)/2, rate, cmp.Or(ps.Seed, 1), most)
	default:
		return nil, 0, 0, &Error{"pattern", strconv.Quote(ps.Name), "must be one of " + strings.Join(LocalQuotaPatterns, ", ") + " (or a CSV file)"}
	}
	return arrivals, start, end, nil
}

// duration returns the span ps covers, µs: ps.Duration, or the default
// for ps.Name that PatternSpec documents, between one window and
// MaxDurationWindows.
func duration(ps PatternSpec, window int64) (int64, error) {
	d := ps.Duration
	if d == 0 {
		switch ps.Name {
		case Poisson:
			d = 30 * window
		case Boundary, SlidingWorst:
			d = 3 * window
		default:
			d = 6 * window
		}
	}
	if d < window || d > MaxDurationWindows*window {
		return 0, &Error{"duration", time.Duration(d * 1000).String(), fmt.Sprintf("must be between one window and %d windows (%v)", MaxDurationWindows, time.Duration(MaxDurationWindows*window*1000))}
	}
	return d, nil
}

// offeredRate returns the requests per second ps offers: ps.Rate, or the
// default for ps.Name, a multiple of limit per window.
func offeredRate(ps PatternSpec, limit, window int64) (float64, error) {
	perSecond := float64(limit) * 1e6 / float64(window)
	rate := ps.Rate
	if rate == 0 {
		switch ps.Name {
		case Poisson:
			rate = 2 * perSecond
		case Step:
			rate = 4 * perSecond
		default:
			rate = 3 * perSecond
		}
	}
	if rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return 0, &Error{"rate", fmt.Sprint(ps.Rate), "must be a positive number of requests per second"}
	}
	return rate, nil
}

// requestBudget returns the most requests ps may offer (ps.MaxRequests,
// at most MaxRequests), or an error when the pattern would offer more:
// rate × d for the patterns paced by rate, 2 × limit for Boundary and
// SlidingWorst.
func requestBudget(ps PatternSpec, limit int64, rate float64, d int64) (int, error) {
	most := MaxRequests
	if ps.MaxRequests > 0 {
		most = min(ps.MaxRequests, MaxRequests)
	}
	fixed := ps.Name == Boundary || ps.Name == SlidingWorst
	if expect := rate * float64(d) / 1e6; expect > float64(most) && !fixed {
		return 0, &Error{"rate", fmt.Sprint(rate), fmt.Sprintf("rate × duration is %.0f requests: at most %d", expect, most)}
	}
	if fixed && 2*limit+1 > int64(most) {
		return 0, &Error{"limit", fmt.Sprint(limit), fmt.Sprintf("the %s pattern offers 2 × limit requests: at most %d", ps.Name, most)}
	}
	return most, nil
}

// poisson returns Poisson arrivals at rate per second in [start, end),
// at most most of them, the same for the same seed.
func poisson(start, end int64, rate float64, seed uint64, most int) []int64 {
	var arrivals []int64
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	meanGap := 1e6 / rate
	for t := float64(start); ; {
		t += rng.ExpFloat64() * meanGap
		if t >= float64(end) || len(arrivals) >= most {
			break
		}
		arrivals = append(arrivals, int64(t))
	}
	return arrivals
}

// step returns Poisson arrivals in [start, end), at most most of them,
// the same for the same seed: one window at lull per second, then half a
// window at rate, repeated. In the lull a bucket stays full and a hot
// subject takes blocks of local quota; the flood spends what they leave.
func step(start, end, window int64, lull, rate float64, seed uint64, most int) []int64 {
	var arrivals []int64
	rng := rand.New(rand.NewPCG(seed, 0x57e9))
	t := float64(start)
	for phase := start; phase < end && len(arrivals) < most; {
		r, next := lull, phase+window
		if (phase-start)%(window+window/2) != 0 {
			r, next = rate, phase+window/2
		}
		next = min(next, end)
		for len(arrivals) < most {
			t += rng.ExpFloat64() * 1e6 / r
			if t >= float64(next) {
				t = float64(next) // the next phase starts afresh
				break
			}
			arrivals = append(arrivals, int64(t))
		}
		phase = next
	}
	return arrivals
}

// bursts returns arrivals in [start, end), at most most of them: evenly
// spaced at rate per second for on µs, then none for off µs, repeated.
// Each burst holds ⌈on × rate⌉ arrivals (counted, not stepped in floating
// point, so none is added by rounding), the last burst cut at the end.
func bursts(start, end int64, rate float64, on, off int64, most int) []int64 {
	var arrivals []int64
	gap := 1e6 / rate
	n := int(math.Ceil(float64(on)*rate/1e6 - 1e-9))
	for p := start; p < end; p += on + off {
		for i := 0; i < n && len(arrivals) < most; i++ {
			t := p + int64(float64(i)*gap)
			if t >= end {
				break
			}
			arrivals = append(arrivals, t)
		}
	}
	return arrivals
}

// boundary returns one request that opens the window at start (a client
// learns the edge from the reset time it is answered with), then the full
// limit in the last 5 % before the edge and the full limit again in the
// first 5 % after it.
func boundary(start, window, limit int64) []int64 {
	arrivals := []int64{start}
	edge := start + window
	arrivals = append(arrivals, spread(edge-window/20, edge, limit)...)
	return append(arrivals, spread(edge, edge+window/20, limit)...)
}

// slidingWorst returns what over-admits most under the sliding window
// counter, which weighs the previous window's units as if spread evenly:
// the limit crowded into the very end of the window from start, then one
// unit at each instant k/limit of the next window, when the estimate has
// just room for it. The crowd lies within the last window/(2 × limit), so
// all of it is still inside the interval that ends at the last of those
// instants: 2 × limit − 1 units in one window's length.
func slidingWorst(start, window, limit int64) []int64 {
	edge := start + window
	arrivals := spread(edge-min(window/100, window/(2*limit)), edge, limit)
	for k := int64(1); k < limit; k++ {
		arrivals = append(arrivals, edge+ceilDiv(k*window, limit))
	}
	return arrivals
}

// ramp returns arrivals over d µs from start at a rate rising linearly
// from 0 to rate per second, at most most of them. It is deterministic:
// the k-th arrival is where ∫rate reaches k.
func ramp(start, d int64, rate float64, most int) []int64 {
	var arrivals []int64
	dur := float64(d) / 1e6
	for k := 1; ; k++ {
		t := math.Sqrt(2 * dur * float64(k) / rate)
		if t >= dur || len(arrivals) >= most {
			break
		}
		arrivals = append(arrivals, start+int64(t*1e6))
	}
	return arrivals
}

// spread returns n instants evenly spaced in [from, to).
func spread(from, to, n int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = from + (to-from)*int64(i)/n
	}
	return out
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// ReadCSV reads request timestamps, one per line, from the first
// comma-separated field: RFC 3339 (fractions allowed) or Unix seconds
// (a decimal fraction allowed). Empty lines, lines starting with '#' and
// a first line that is not a time (a header) are skipped. The arrivals
// are sorted; start is the first truncated to a multiple of window, end
// lies one microsecond after the last. At most MaxRequests lines are read.
func ReadCSV(r io.Reader, window int64) (arrivals []int64, start, end int64, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		field, _, _ := strings.Cut(text, ",")
		field = strings.Trim(strings.TrimSpace(field), `"`)
		t, perr := parseTime(field)
		if perr != nil {
			if line == 1 {
				continue // a header
			}
			return nil, 0, 0, &Error{fmt.Sprintf("csv line %d", line), strconv.Quote(field), "want an RFC 3339 time or Unix seconds, e.g. 2024-05-01T12:00:00.25Z or 1714564800.25"}
		}
		if len(arrivals) == MaxRequests {
			return nil, 0, 0, &Error{fmt.Sprintf("csv line %d", line), "", fmt.Sprintf("at most %d requests", MaxRequests)}
		}
		arrivals = append(arrivals, t)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, 0, fmt.Errorf("csv line %d: %w", line+1, err)
	}
	if len(arrivals) == 0 {
		return nil, 0, 0, &Error{"csv", "", "no timestamps found"}
	}
	slices.Sort(arrivals)
	start = arrivals[0] - arrivals[0]%window
	end = max(arrivals[len(arrivals)-1]+1, start+window)
	return arrivals, start, end, nil
}

// parseTime reads an RFC 3339 time or Unix seconds into µs since the epoch.
func parseTime(s string) (int64, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		if t.Unix() <= 0 {
			return 0, fmt.Errorf("before 1970")
		}
		return t.UnixMicro(), nil
	}
	whole, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec <= 0 || sec > 1<<40 {
		return 0, fmt.Errorf("not a time")
	}
	us := sec * 1_000_000
	if frac != "" {
		if len(frac) > 6 {
			frac = frac[:6]
		}
		f, err := strconv.ParseUint(frac, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("not a time")
		}
		for i := len(frac); i < 6; i++ {
			f *= 10
		}
		us += int64(f)
	}
	return us, nil
}
