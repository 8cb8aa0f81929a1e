package simulate

import (
	"fmt"
	"html"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// Chart geometry, in SVG user units.
const (
	chartWidth  = 960
	plotLeft    = 60
	plotRight   = 900
	laneHeight  = 150
	laneTop     = 34 // title lines above the plot
	plotHeight  = 96
	headerH     = 62
	maxBins     = 120
	maxEdges    = 60
	pixelsWidth = plotRight - plotLeft
)

var laneColors = []string{"#d9480f", "#2b8a3e", "#1971c2", "#7048e8", "#c2255c"}

// SVG writes r as a self-contained SVG chart: one lane per policy with the
// offered and admitted requests per time bin as bars, the units admitted
// in the last window-length interval as a line against the limit, and the
// window edges. title heads the chart.
func SVG(w io.Writer, r *Result, title string) error {
	c := newChart(r)
	var b strings.Builder
	c.header(&b, title)
	for i := range r.Results {
		c.lane(&b, i, &r.Results[i])
	}
	c.timeAxis(&b)
	b.WriteString("\n</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// chart is the geometry every lane of an SVG chart shares: the time
// bins of the bars and the scales of the bars and the lines.
type chart struct {
	s       *Spec
	lanes   int
	span    int64 // µs the chart covers
	bin     int64 // µs one bar covers
	offered []int // requests offered per bin
	barMax  int   // the bars' scale: the most offered in one bin
	lineMax int   // the lines' scale: at least twice every limit
}

// newChart lays out r in at most maxBins bins.
func newChart(r *Result) *chart {
	s := &r.Spec
	c := &chart{s: s, lanes: len(r.Results), span: s.End - s.Start, barMax: 1, lineMax: 1}
	c.bin = max(ceilDiv(c.span, maxBins), 1)
	c.offered = make([]int, ceilDiv(c.span, c.bin))
	for _, t := range s.Arrivals {
		c.offered[(t-s.Start)/c.bin]++
	}
	for _, n := range c.offered {
		c.barMax = max(c.barMax, n)
	}
	for i := range r.Results {
		pr := &r.Results[i]
		c.lineMax = max(c.lineMax, pr.MaxInWindow, int(2*pr.Policy.Params.Limit))
	}
	return c
}

// x is the horizontal position of instant t.
func (c *chart) x(t int64) float64 {
	return plotLeft + float64(t-c.s.Start)*pixelsWidth/float64(c.span)
}

// header opens the SVG document and writes its title and legend.
func (c *chart) header(b *strings.Builder, title string) {
	height := headerH + laneHeight*c.lanes + 24
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", chartWidth, height, chartWidth, height)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", plotLeft, esc(title))
	fmt.Fprintf(b, `<text x="%d" y="38" fill="#555">bars: requests per %s (grey offered, colour admitted) · red line: admitted in the last window-length interval (right axis) · dashed: the limit</text>`+"\n", plotLeft, fmtDur(c.bin))
	fmt.Fprintf(b, `<text x="%d" y="54" fill="#555">dotted verticals: window edges aligned to the clock (sliding_window's); fixed_window's lane marks the windows it opened (orange)</text>`+"\n", plotLeft)
}

// lane writes the i-th lane, pr's: its title and numbers, the frame and
// axes, then the window edges, bars, opened windows and lines between
// the plot's top p0 and its baseline p1.
func (c *chart) lane(b *strings.Builder, i int, pr *PolicyResult) {
	top := headerH + laneHeight*i
	p0 := float64(top + laneTop)              // plot top
	p1 := float64(top + laneTop + plotHeight) // plot bottom (baseline)
	col := laneColors[i%len(laneColors)]
	fmt.Fprintf(b, `<g class="lane" data-policy="%s">`+"\n", esc(pr.Policy.Name))
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold" fill="%s">%s</text>`, plotLeft, top+14, col, esc(pr.Policy.Name))
	fmt.Fprintf(b, `<text x="%d" y="%d" fill="#333">%s · admitted %d of %d · most in one window %d (%.1f× limit) · false admissions %.1f%% · false denials %.1f%%</text>`+"\n",
		plotLeft, top+28, esc(numbers(pr.Policy)), pr.Allowed, pr.Offered, pr.MaxInWindow, pr.MaxRatio(), pr.FalseAdmitPct(), pr.FalseDenialPct())
	// Frame and axes.
	fmt.Fprintf(b, `<rect x="%d" y="%.0f" width="%d" height="%d" fill="none" stroke="#ddd"/>`+"\n", plotLeft, p0, pixelsWidth, plotHeight)
	fmt.Fprintf(b, `<text x="%d" y="%.0f" text-anchor="end" fill="#777">%d</text><text x="%d" y="%.0f" text-anchor="end" fill="#777">0</text>`+"\n", plotLeft-4, p0+10, c.barMax, plotLeft-4, p1)
	fmt.Fprintf(b, `<text x="%d" y="%.0f" fill="#c92a2a">%d</text>`+"\n", plotRight+4, p0+10, c.lineMax)
	c.windowEdges(b, pr.Policy.Params.Window, p0, p1)
	c.bars(b, pr, col, p1)
	c.opened(b, pr, p0, p1)
	// The limit and the trailing-window count.
	prm := pr.Policy.Params
	ly := func(n int) float64 { return p1 - float64(n)*plotHeight/float64(c.lineMax) }
	fmt.Fprintf(b, `<path d="M%d %.1fH%d" stroke="#c92a2a" stroke-dasharray="6 4" fill="none"/><text x="%d" y="%.1f" fill="#c92a2a">limit %d</text>`+"\n",
		plotLeft, ly(int(prm.Limit)), plotRight, plotRight+4, ly(int(prm.Limit))+4, prm.Limit)
	fmt.Fprintf(b, `<path class="inwindow" d="%s" stroke="#c92a2a" stroke-width="1.5" fill="none"/>`+"\n", trailingPath(pr, c.s, c.x, ly))
	b.WriteString("</g>\n")
}

// windowEdges writes the edges of windows of length window aligned to
// the clock as dotted verticals from p0 to p1, unless there are more
// than maxEdges windows.
func (c *chart) windowEdges(b *strings.Builder, window int64, p0, p1 float64) {
	if c.span/window > maxEdges {
		return
	}
	var e strings.Builder
	for t := c.s.Start - c.s.Start%window + window; t < c.s.End; t += window {
		if t > c.s.Start {
			fmt.Fprintf(&e, "M%.1f %.0fV%.0f", c.x(t), p0, p1)
		}
	}
	if e.Len() > 0 {
		fmt.Fprintf(b, `<path d="%s" stroke="#888" stroke-dasharray="2 3" fill="none"/>`+"\n", e.String())
	}
}

// bars writes the requests per bin standing on baseline p1: those
// offered in grey behind, those pr admitted in col in front.
func (c *chart) bars(b *strings.Builder, pr *PolicyResult, col string, p1 float64) {
	admitted := make([]int, len(c.offered))
	for j, t := range c.s.Arrivals {
		if pr.Admitted[j] {
			admitted[(t-c.s.Start)/c.bin]++
		}
	}
	bw := float64(pixelsWidth) / float64(len(c.offered))
	for k, counts := range [][]int{c.offered, admitted} {
		var d strings.Builder
		for j, n := range counts {
			if n == 0 {
				continue
			}
			h := float64(n) * plotHeight / float64(c.barMax)
			fmt.Fprintf(&d, "M%.1f %.1fh%.1fv%.1fh%.1fz", plotLeft+float64(j)*bw, p1-h, bw*0.9, h, -bw*0.9)
		}
		fill, class := "#ced4da", "offered"
		if k == 1 {
			fill, class = col, "admitted"
		}
		if d.Len() > 0 {
			fmt.Fprintf(b, `<path class="%s" d="%s" fill="%s"/>`+"\n", class, d.String(), fill)
		}
	}
}

// opened marks the windows pr's algorithm opened (fixed_window's) as
// orange verticals from a little above p0 to p1, unless there are none
// or more than maxEdges.
func (c *chart) opened(b *strings.Builder, pr *PolicyResult, p0, p1 float64) {
	if len(pr.WindowStarts) == 0 || len(pr.WindowStarts) > maxEdges {
		return
	}
	var e strings.Builder
	for _, t := range pr.WindowStarts {
		fmt.Fprintf(&e, "M%.1f %.0fV%.0f", c.x(t), p0-4, p1)
	}
	fmt.Fprintf(b, `<path class="opened" d="%s" stroke="#f08c00" stroke-width="2" stroke-opacity="0.8" fill="none"/>`+"\n", e.String())
}

// timeAxis labels the time axis below the last lane at seven evenly
// spaced instants, as durations since the start.
func (c *chart) timeAxis(b *strings.Builder) {
	axisY := headerH + laneHeight*c.lanes + 4
	for k := 0; k <= 6; k++ {
		t := c.s.Start + c.span*int64(k)/6
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`, c.x(t), axisY+10, fmtDur(t-c.s.Start))
	}
}

// trailingPath draws the units admitted in (t−Window, t] as a step line,
// one column of pixels at a time (the most in each column), so a long
// run draws no more than a few thousand points.
func trailingPath(pr *PolicyResult, s *Spec, x func(int64) float64, ly func(int) float64) string {
	w := pr.Policy.Params.Window
	// Events: +1 at each admission, −1 one window later.
	var adds []int64
	for j, t := range s.Arrivals {
		if pr.Admitted[j] {
			adds = append(adds, t)
		}
	}
	cols := make([]int, pixelsWidth+1)
	span := s.End - s.Start
	col := func(t int64) int { return int(min(max((t-s.Start)*pixelsWidth/span, 0), pixelsWidth)) }
	n, i, j := 0, 0, 0
	for i < len(adds) || j < len(adds) {
		var t int64
		if i < len(adds) && adds[i] < adds[j]+w {
			t = adds[i]
			n++
			i++
		} else {
			t = adds[j] + w
			n--
			j++
		}
		if t >= s.End {
			break
		}
		c := col(t)
		cols[c] = max(cols[c], n)
		// The columns up to the next event hold the count too.
		if j < len(adds) {
			next := adds[j] + w
			if i < len(adds) {
				next = min(next, adds[i])
			}
			for k := c + 1; k < col(next) && k <= pixelsWidth; k++ {
				cols[k] = n
			}
		}
	}
	var b strings.Builder
	prev := -1
	for c, v := range cols {
		y := ly(v)
		switch {
		case c == 0:
			fmt.Fprintf(&b, "M%d %.1f", plotLeft, y)
		case v != prev:
			fmt.Fprintf(&b, "H%dV%.1f", plotLeft+c, y)
		}
		prev = v
	}
	fmt.Fprintf(&b, "H%d", plotRight)
	return b.String()
}

// numbers describes a policy's numbers, e.g. "10 per 10s" or
// "10 per 10s, burst 5".
func numbers(p Policy) string {
	s := fmt.Sprintf("%d per %s", p.Params.Limit, fmtDur(p.Params.Window))
	if (p.Kind == algorithm.KindTokenBucket || p.Kind == algorithm.KindGCRA) && p.Params.Burst != p.Params.Limit {
		s += fmt.Sprintf(", burst %d", p.Params.Burst)
	}
	return s
}

// fmtDur prints µs as a Go duration, e.g. "10s", "1.5s".
func fmtDur(us int64) string {
	return (time.Duration(us) * time.Microsecond).String()
}

func esc(s string) string { return html.EscapeString(s) }

// WriteTable writes the summary of r as an aligned text table.
func WriteTable(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "algorithm\tnumbers\toffered\tadmitted\tdenied\tmost in a window\t× limit\tfalse admissions\tfalse denials\t")
	for i := range r.Results {
		pr := &r.Results[i]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%.2f\t%.1f%%\t%.1f%%\t\n", pr.Policy.Name, numbers(pr.Policy), pr.Offered, pr.Allowed, pr.Denied, pr.MaxInWindow, pr.MaxRatio(), pr.FalseAdmitPct(), pr.FalseDenialPct())
	}
	return tw.Flush()
}

// MarkdownRow returns one row of ACCURACY.md's table for pr on pattern.
func MarkdownRow(pattern string, pr *PolicyResult) string {
	return "| " + strings.Join([]string{
		pattern, pr.Policy.Name,
		strconv.Itoa(pr.Offered), strconv.Itoa(pr.Allowed),
		fmt.Sprintf("%d (%.1f×)", pr.MaxInWindow, pr.MaxRatio()),
		fmt.Sprintf("%.1f %%", pr.FalseAdmitPct()),
		fmt.Sprintf("%.1f %%", pr.FalseDenialPct()),
	}, " | ") + " |"
}

// MarkdownHeader is the header of the table MarkdownRow fills.
const MarkdownHeader = "| pattern | algorithm | offered | admitted | most in any window (× limit) | false admissions | false denials |\n|---|---|--:|--:|--:|--:|--:|"
