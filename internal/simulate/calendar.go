package simulate

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/period"
)

// Calendar is the calendar pattern's name: a month in Europe/Berlin that
// holds its change to summer time (2026-03-15 to 2026-04-15: 29 March has
// 23 hours, and March ends), Poisson arrivals at twice a daily limit of 10
// (20 a day), seeded; run through fixed_window counting per Berlin day
// and per Berlin month, and through a 24h window aligned to the clock
// (UTC midnight) for contrast, each measured against the exact count per
// Berlin day or month.
const Calendar = "calendar"

// CalendarRow is what one policy did with the calendar pattern.
type CalendarRow struct {
	Name              string // e.g. "fixed_window period=day time_zone=Europe/Berlin, 10"
	Limit             int64
	Offered, Admitted int
	// Most is the most units admitted in one period of the reference
	// (a Berlin day or month); at most Limit when exact.
	Most int
	// FalseAdmits and FalseDenials are requests decided otherwise than
	// the exact count per reference period.
	FalseAdmits, FalseDenials int
	// Denials and ExactResets count the denials and those whose
	// Retry-After ran exactly, to the µs, to the end of the reference
	// period the request fell in.
	Denials, ExactResets int
}

// calendarPolicy is one row's policy: a period's (unit, on the engine's
// KindFixedPeriod) or a window's; ref is the unit it is measured against.
type calendarPolicy struct {
	name     string
	limit    int64
	unit     period.Unit // 0: a window
	window   int64       // µs, aligned to the clock; for unit 0
	refUnit  period.Unit
	location *time.Location
}

// RunCalendar runs the calendar pattern with seed and returns its rows.
func RunCalendar(seed uint64) ([]CalendarRow, error) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		return nil, fmt.Errorf("calendar pattern: %w (the machine needs tzdata)", err)
	}
	start := time.Date(2026, 3, 15, 0, 0, 0, 0, berlin).UnixMicro()
	end := time.Date(2026, 4, 15, 0, 0, 0, 0, berlin).UnixMicro()
	arrivals := poisson(start, end, 20.0/86400, seed, MaxRequests)
	policies := []calendarPolicy{
		{"fixed_window period=day time_zone=Europe/Berlin", 10, period.Day, 0, period.Day, berlin},
		{"fixed_window window=24h align=clock (UTC days)", 10, 0, 86_400_000_000, period.Day, berlin},
		{"fixed_window period=month time_zone=Europe/Berlin", 300, period.Month, 0, period.Month, berlin},
	}
	rows := make([]CalendarRow, len(policies))
	for i, p := range policies {
		if rows[i], err = p.run(arrivals); err != nil {
			return nil, fmt.Errorf("calendar pattern: %s: %w", p.name, err)
		}
	}
	return rows, nil
}

// run decides every arrival under p with the engine, as a store does (the
// periods around each request's time from package period), beside the
// exact count per reference period.
func (p calendarPolicy) run(arrivals []int64) (CalendarRow, error) {
	row := CalendarRow{Name: fmt.Sprintf("%s, %d", p.name, p.limit), Limit: p.limit, Offered: len(arrivals)}
	ap := algorithm.Policy{Kind: algorithm.KindFixedWindow, Params: algorithm.Params{Limit: p.limit, Window: p.window, Burst: p.limit, Aligned: true}, MaxCost: p.limit}
	if p.unit != 0 {
		ap.Kind, ap.Params.Aligned = algorithm.KindFixedPeriod, false
	}
	var st algorithm.State
	admitted := map[int64]int{} // per reference period, by its start
	exact := map[int64]int64{}
	var w algorithm.Write
	var d algorithm.Decision
	for _, t := range arrivals {
		if p.unit != 0 {
			b := period.Bounds(p.unit, p.location, t)
			ap.Params.Bounds, ap.Params.Window = b, b[2]-b[1]
		}
		commit, err := algorithm.DecideOne(&ap, &st, t, -1, algorithm.OpSpend, 1, 0, "", &w, &d)
		if err != nil {
			return row, err // none: the bounds hold t by construction
		}
		if commit {
			st.Apply(&w)
		}
		ref := period.Bounds(p.refUnit, p.location, t)
		fits := exact[ref[1]] < p.limit
		if fits {
			exact[ref[1]]++
		}
		if d.Allowed {
			row.Admitted++
			admitted[ref[1]]++
			row.Most = max(row.Most, admitted[ref[1]])
		} else {
			row.Denials++
			if d.RetryAfter == ref[2]-t {
				row.ExactResets++
			}
		}
		switch {
		case d.Allowed && !fits:
			row.FalseAdmits++
		case !d.Allowed && fits:
			row.FalseDenials++
		}
	}
	return row, nil
}

// calendarHeader is the header of the table CalendarMarkdown writes.
const calendarHeader = "| pattern | policy, limit | offered | admitted | most in any Berlin period (× limit) | false admissions | false denials | Retry-After at the period's end |\n|---|---|--:|--:|--:|--:|--:|--:|"

// CalendarMarkdown returns rows as ACCURACY.md's calendar table.
func CalendarMarkdown(rows []CalendarRow) string {
	var b strings.Builder
	b.WriteString(calendarHeader + "\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join([]string{
			Calendar, r.Name, strconv.Itoa(r.Offered), strconv.Itoa(r.Admitted),
			fmt.Sprintf("%d (%.1f×)", r.Most, float64(r.Most)/float64(r.Limit)),
			fmt.Sprintf("%.1f %%", pct(r.FalseAdmits, r.Offered)),
			fmt.Sprintf("%.1f %%", pct(r.FalseDenials, r.Offered)),
			fmt.Sprintf("%d of %d", r.ExactResets, r.Denials),
		}, " | ") + " |\n")
	}
	return b.String()
}

// WriteCalendar is sluice simulate --pattern calendar: it runs the
// calendar pattern with seed and writes ACCURACY.md's calendar table to w.
// Its policies are its own, so of the flags set (by name) only pattern
// and seed apply; another is refused through usage, which makes the
// command's usage error of it.
func WriteCalendar(w io.Writer, seed uint64, set map[string]bool, usage func(error) error) error {
	for _, name := range slices.Sorted(maps.Keys(set)) {
		if name != "pattern" && name != "seed" {
			return usage(fmt.Errorf("--%s does not apply to the calendar pattern: only --seed", name))
		}
	}
	rows, err := RunCalendar(seed)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	_, err = io.WriteString(w, CalendarMarkdown(rows))
	return err
}
