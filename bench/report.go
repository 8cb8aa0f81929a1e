package main

import (
	"fmt"
	"html"
	"math"
	"sort"
	"strings"
)

// groupKey names the cell a result belongs to.
type groupKey struct {
	mode     mode
	subjects int
	callers  int
}

func keyOf(r *result) groupKey { return groupKey{r.Mode, r.Subjects, r.Callers} }

// compare sets every result's ratios to the best peer of the same kind
// (Redis path or in process) in the same cell: decisions/s over the
// peer's highest, Redis CPU per decision over the peer's lowest. Floors
// are compared with the Redis peers.
func compare(rs []result) {
	type best struct{ perSec, cpu float64 }
	bests := map[groupKey]map[kind]*best{}
	for i := range rs {
		r := &rs[i]
		if !r.Peer || r.Errors > r.Decisions {
			continue
		}
		g := bests[keyOf(r)]
		if g == nil {
			g = map[kind]*best{}
			bests[keyOf(r)] = g
		}
		b := g[r.Kind]
		if b == nil {
			b = &best{cpu: math.Inf(1)}
			g[r.Kind] = b
		}
		b.perSec = max(b.perSec, r.PerSecond)
		if r.Kind == redisPath && r.RedisCPUPerDecision > 0 {
			b.cpu = min(b.cpu, r.RedisCPUPerDecision)
		}
	}
	for i := range rs {
		r := &rs[i]
		k := r.Kind
		if k == floor {
			k = redisPath
		}
		b := bests[keyOf(r)][k]
		if b == nil {
			continue
		}
		if b.perSec > 0 {
			r.PerSecondVsBestPeer = r.PerSecond / b.perSec
		}
		if k == redisPath && !math.IsInf(b.cpu, 1) && r.RedisCPUPerDecision > 0 {
			r.RedisCPUVsBestPeer = r.RedisCPUPerDecision / b.cpu
		}
	}
}

// num formats n with a space between thousands: 28 800.
func num(n float64) string {
	s := fmt.Sprintf("%.0f", n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func f1(v float64) string {
	if v == 0 {
		return "—"
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func ratio(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v)
}

func modeTitle(m mode) string {
	if m == deniedMode {
		return "mostly denied (1 per hour)"
	}
	return "mostly allowed (a limit never reached)"
}

func subjectsTitle(n int) string {
	if n == 1 {
		return "one hot subject"
	}
	return num(float64(n)) + " subjects"
}

// markdown renders the report: the machine, one table per cell, the
// memory per subject and the check API.
func markdown(rep *report) string {
	var b strings.Builder
	m := rep.Machine
	if rep.Hot != nil {
		fmt.Fprintf(&b, "Measured %s: %s, %d CPUs; %s; %s. %s per row (the allowed cell after %s of warm-up, the reached one from a flushed store), each row in processes started for it.\n\n",
			m.Date, m.CPU, m.CPUs, m.Go, m.Redis, m.Duration, m.Warmup)
		fmt.Fprintf(&b, "Command: `cd bench && %s`\n\n", m.Command)
		hotMarkdown(&b, rep)
		return b.String()
	}
	fmt.Fprintf(&b, "Measured %s: %s, %d CPUs (GOMAXPROCS %d); %s; %s. %s per cell after %s of warm-up; one go-redis client with a pool of %d shared by all callers.",
		m.Date, m.CPU, m.CPUs, m.GOMAXPROCS, m.Go, m.Redis, m.Duration, m.Warmup, m.Pool)
	if m.Passes > 1 {
		fmt.Fprintf(&b, " Each cell ran %d times, interleaved; every row is the pass with the median decisions/s.", m.Passes)
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "Command: `cd bench && %s`\n\n", m.Command)
	b.WriteString(legend)
	instructionTables(&b, rep)
	var keys []groupKey
	groups := map[groupKey][]result{}
	for _, r := range rep.Results {
		k := keyOf(&r)
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	for _, k := range keys {
		fmt.Fprintf(&b, "### %s, %s, %d callers\n\n", strings.ToUpper(modeTitle(k.mode)[:1])+modeTitle(k.mode)[1:], subjectsTitle(k.subjects), k.callers)
		b.WriteString("| limiter | decisions/s | × best peer | p50 µs | p99 µs | p99.9 µs | allowed | denied | errors | client allocs/dec | client CPU µs/dec | Redis CPU µs/dec | × best peer | Redis cmds/dec | scripts/dec | round trips/dec | Redis instr/dec | socket ev/dec |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range groups[k] {
			name := r.Limiter
			if r.Peer {
				name = "*" + name + "*"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				name, num(r.PerSecond), ratio(r.PerSecondVsBestPeer), f1(r.P50US), f1(r.P99US), f1(r.P999US),
				num(float64(r.Allowed)), num(float64(r.Denied)), num(float64(r.Errors)),
				f1(r.AllocsPerDecision), f1(r.ClientCPUPerDecision), f1(r.RedisCPUPerDecision), ratio(r.RedisCPUVsBestPeer),
				f1(r.RedisCommandsPerDecision), f1(r.ScriptCallsPerDecision), f1(r.RoundTripsPerDecision),
				instr(r.RedisInstructionsPerDecision), f2(r.SocketEventsPerDecision))
		}
		var errs []string
		for _, r := range groups[k] {
			if r.FirstError != "" {
				errs = append(errs, fmt.Sprintf("%s: %d errors, the first: `%s`", r.Limiter, r.Errors, r.FirstError))
			}
		}
		if len(errs) > 0 {
			b.WriteString("\nErrors: " + strings.Join(errs, "; ") + "\n")
		}
		b.WriteString("\n")
	}
	if len(rep.Memory) > 0 {
		b.WriteString("### Redis memory per subject\n\nOne allowed decision for one 43-byte subject on a flushed server, then `MEMORY USAGE` summed over every key `SCAN` finds. Key bytes is the length of those keys' names, which `MEMORY USAGE` includes.\n\n| limiter | bytes | key bytes | keys |\n|---|---:|---:|---|\n")
		for _, mr := range rep.Memory {
			n := 0
			for _, k := range mr.Keys {
				n += len(k)
			}
			fmt.Fprintf(&b, "| %s | %d | %d | `%s` |\n", mr.Limiter, mr.Bytes, n, strings.Join(mr.Keys, "`, `"))
		}
		b.WriteString("\n")
	}
	if len(rep.HTTP) > 0 {
		b.WriteString("### Check API end to end\n\n`sluice serve` as its own process (built from ../cmd/sluice, default options, subjects pseudonymized by the server), `POST /v1/check` over HTTP/1.1 keep-alive, one connection per caller. The proxy rows send `GET /<mode>` with the subject in `X-Subject` through the same process's rate-limiting reverse proxy to an upstream of the load generator that answers every request `200 ok`; the floor row is that upstream alone, without the proxy. The library column is `Limiter.Check` on the same store and algorithm in the same cell of this run.\n\n")
		b.WriteString("| check API | callers | subjects | mode | decisions/s | p50 µs | p99 µs | p99.9 µs | errors | server CPU µs/dec | Redis CPU µs/dec | load generator CPU µs/dec | library decisions/s | API ÷ library |\n")
		b.WriteString("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rep.HTTP {
			lib := libraryFigure(rep.Results, &r)
			libS, rat := "—", "—"
			if lib > 0 {
				libS, rat = num(lib), fmt.Sprintf("%.2f×", r.PerSecond/lib)
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				r.Limiter, r.Callers, r.Subjects, r.Mode, num(r.PerSecond), f1(r.P50US), f1(r.P99US), f1(r.P999US), num(float64(r.Errors)),
				f1(r.ServerCPUPerDecision), f1(r.RedisCPUPerDecision), f1(r.ClientCPUPerDecision), libS, rat)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func instr(v float64) string {
	if v == 0 {
		return "—"
	}
	return num(v)
}

func f2(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", v)
}

// The batched floors every instruction ratio is taken to.
var (
	fixedWindowFloor = batchedFloorTargets()[0].name
	gcraFloor        = batchedFloorTargets()[1].name
)

// instructionTables writes, for every cell measured under callgrind, the
// Redis instructions per decision of each Redis row and its ratio to
// the two batched floors of the same cell, beside decisions/s and CPU.
func instructionTables(b *strings.Builder, rep *report) {
	rs := rep.Results
	beside := func(r *result) *result { return r }
	if rep.Beside != nil {
		beside = func(r *result) *result {
			for i := range rep.Beside.Results {
				o := &rep.Beside.Results[i]
				if o.Limiter == r.Limiter && keyOf(o) == keyOf(r) {
					return o
				}
			}
			return &result{}
		}
	}
	var keys []groupKey
	groups := map[groupKey][]result{}
	for _, r := range rs {
		if r.RedisInstructionsPerDecision == 0 {
			continue
		}
		k := keyOf(&r)
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	for _, k := range keys {
		var fw, g float64
		for _, r := range groups[k] {
			switch r.Limiter {
			case fixedWindowFloor:
				fw = r.RedisInstructionsPerDecision
			case gcraFloor:
				g = r.RedisInstructionsPerDecision
			}
		}
		fmt.Fprintf(b, "### Redis instructions per decision: %s, %s, %d callers\n\n", modeTitle(k.mode), subjectsTitle(k.subjects), k.callers)
		b.WriteString("Counted by callgrind in redis-server (user space, the measured phase only): the same on any machine for the same binaries and batching. The ratios divide by the batched floors of the same run. ")
		if rep.Beside != nil {
			fmt.Fprintf(b, "Decisions/s, CPU and allocations are this machine's, from the same cells run without callgrind (`cd bench && %s`, %s).\n\n", rep.Beside.Machine.Command, rep.Beside.Machine.Date)
		} else {
			b.WriteString("Decisions/s, CPU and allocations are this machine's under callgrind (20–50× slower than without it): compare them within the table only.\n\n")
		}
		b.WriteString("| limiter | Redis instructions/dec | × minimal fixed window | × redis_rate GCRA batched | socket read+write events/dec | decisions/s | Redis CPU µs/dec | client CPU µs/dec | client allocs/dec |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range groups[k] {
			name := r.Limiter
			if r.Peer {
				name = "*" + name + "*"
			}
			vs := func(ref float64) string {
				if ref == 0 {
					return "—"
				}
				return ratio(r.RedisInstructionsPerDecision / ref)
			}
			o := beside(&r)
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, instr(r.RedisInstructionsPerDecision), vs(fw), vs(g),
				f2(r.SocketEventsPerDecision), num(o.PerSecond), f1(o.RedisCPUPerDecision), f1(o.ClientCPUPerDecision), f1(o.AllocsPerDecision))
		}
		b.WriteString("\n")
	}
}

// legend says what each column of the cell tables counts.
const legend = `How to read the cell tables:

- *decisions/s*: allowed + denied decisions per second of the measured time, all callers together; calls that failed count as errors, not decisions. *× best peer* divides it by the highest decisions/s of a peer of the same kind in the same cell (Redis path: redis_rate, ulule/limiter, throttled; in process: go-limiter, the x/time/rate map). Peers are in italics. Floors are not limiters; they are compared with the Redis peers.
- *p50/p99/p99.9*: latency of one call as a caller sees it, queueing for a pool connection included; a pipelined floor's call carries 16 decisions.
- *client allocs/dec*, *client CPU µs/dec*: ` + "`runtime.MemStats.Mallocs`" + ` and ` + "`getrusage`" + ` (user + system) deltas of this whole process, the load generator included, per decision.
- *Redis CPU µs/dec*: ` + "`INFO cpu`" + ` used_cpu_user + used_cpu_sys delta per decision. *× best peer* divides by the lowest Redis CPU of a Redis peer in the same cell.
- *Redis cmds/dec*: ` + "`INFO stats`" + ` total_commands_processed delta per decision. It counts the commands a script runs inside (each ` + "`redis.call`" + `) as well as the EVALSHA itself. *scripts/dec*: EVAL, EVALSHA, FCALL (and _RO forms) calls from ` + "`INFO commandstats`" + `. *round trips/dec*: the client's calls to Redis counted by a go-redis hook, a pipeline counting once.
- *Redis instr/dec* (runs with ` + "`-callgrind-pid`" + ` only): instructions callgrind counted in redis-server over the measured phase, per decision. *socket ev/dec*: ` + "`INFO stats`" + ` total_reads_processed + total_writes_processed delta per decision, the kernel work the instruction count leaves out.

`

// libraryFigure finds the decisions/s of Limiter.Check on the check API
// row's store and algorithm in the same cell.
func libraryFigure(rs []result, h *result) float64 {
	name := strings.TrimPrefix(h.Limiter, "sluice serve ")
	name = strings.TrimSuffix(strings.TrimSuffix(name, ", POST /v1/check"), ", proxy")
	for _, r := range rs {
		if r.Limiter == "sluice "+name && keyOf(&r) == keyOf(h) {
			return r.PerSecond
		}
	}
	return 0
}

// chart draws decisions/s against callers per limiter for the mostly
// allowed cells of the most subjects measured: the Redis path (with the
// floors) on the left, in process on the right.
func chart(rs []result) string {
	subjects := 0
	for _, r := range rs {
		if r.Mode == allowedMode {
			subjects = max(subjects, r.Subjects)
		}
	}
	type series struct {
		name   string
		peer   bool
		floor  bool
		points map[int]float64
	}
	panels := [2][]*series{}
	var callers []int
	seenCallers := map[int]bool{}
	index := map[string]*series{}
	for _, r := range rs {
		// Pipelined floors run 5 to 20 times faster than any limiter here
		// and would flatten every other line: the tables hold them.
		if r.Mode != allowedMode || r.Subjects != subjects || strings.Contains(r.Limiter, "pipelined") {
			continue
		}
		p := 0
		if r.Kind == inProcess {
			p = 1
		}
		s := index[r.Limiter]
		if s == nil {
			s = &series{name: r.Limiter, peer: r.Peer, floor: r.Kind == floor, points: map[int]float64{}}
			index[r.Limiter] = s
			panels[p] = append(panels[p], s)
		}
		s.points[r.Callers] = r.PerSecond
		if !seenCallers[r.Callers] {
			seenCallers[r.Callers] = true
			callers = append(callers, r.Callers)
		}
	}
	sort.Ints(callers)
	const (
		panelW, panelH = 470.0, 300.0
		left, top      = 70.0, 50.0
		gap            = 40.0
		legendLine     = 16.0
	)
	legendRows := max(len(panels[0]), len(panels[1]))
	width := 2*(left+panelW) + gap + 20
	height := top + panelH + 50 + float64(legendRows)*legendLine + 20
	palette := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="15" font-weight="bold">Decisions/s against concurrent callers, %s, mostly allowed (pipelined floors: see the tables)</text>`+"\n", left, html.EscapeString(subjectsTitle(subjects)))
	titles := [2]string{"Redis path (one local redis-server, one shared go-redis client)", "In process"}
	for p, ss := range panels {
		x0 := left + float64(p)*(left+panelW+gap)
		ymax := 0.0
		for _, s := range ss {
			for _, v := range s.points {
				ymax = max(ymax, v)
			}
		}
		step := niceStep(ymax / 5)
		if step == 0 {
			step = 1
		}
		ytop := math.Ceil(ymax/step) * step
		if ytop == 0 {
			ytop = step
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", x0, top-10, html.EscapeString(titles[p]))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", x0, top, panelW, panelH)
		for v := 0.0; v <= ytop+step/2; v += step {
			y := top + panelH - v/ytop*panelH
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`+"\n", x0, y, x0+panelW, y)
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-5, y+4, num(v))
		}
		xAt := func(i int) float64 {
			if len(callers) == 1 {
				return x0 + panelW/2
			}
			return x0 + 30 + float64(i)*(panelW-60)/float64(len(callers)-1)
		}
		for i, c := range callers {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%d</text>`+"\n", xAt(i), top+panelH+16, c)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">concurrent callers</text>`+"\n", x0+panelW/2, top+panelH+34)
		ci, fi := 0, 0
		floorDashes := []string{` stroke-dasharray="2 3"`, ` stroke-dasharray="8 3 2 3"`, ` stroke-dasharray="1 6"`}
		for si, s := range ss {
			color, dash := "#777", floorDashes[fi%len(floorDashes)]
			if s.floor {
				fi++
			} else {
				color, dash = palette[ci%len(palette)], ""
				ci++
				if s.peer {
					dash = ` stroke-dasharray="7 4"`
				}
			}
			var pts []string
			for i, c := range callers {
				if v, ok := s.points[c]; ok {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", xAt(i), top+panelH-v/ytop*panelH))
				}
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), color, dash)
			for _, pt := range pts {
				xy := strings.Split(pt, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`+"\n", xy[0], xy[1], color)
			}
			ly := top + panelH + 56 + float64(si)*legendLine
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/>`+"\n", x0, ly-4, x0+26, ly-4, color, dash)
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", x0+32, ly, html.EscapeString(s.name))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 0
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
