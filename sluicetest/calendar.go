package sluicetest

import (
	"context"
	"slices"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, on a machine without /usr/share/zoneinfo

	"github.com/sluicehq/sluice"
)

// testCalendar runs the calendar period cases.
func testCalendar(t *testing.T, newStore newStoreFunc) {
	t.Run("CalendarMonthAcrossDST", func(t *testing.T) {
		for _, c := range []struct{ zone, from string }{
			{"Europe/Berlin", "2026-03-15T00:00:00+01:00"},    // CET → CEST on 29 March, then April
			{"America/New_York", "2026-10-15T00:00:00-04:00"}, // November begins; EDT → EST on 1 November
		} {
			t.Run(c.zone, func(t *testing.T) { testCalendarMonth(t, newStore, c.zone, c.from) })
		}
	})
	t.Run("CalendarOverrideKeepsTheMonth", func(t *testing.T) { testCalendarOverride(t, newStore) })
}

// calendarPeriod is the oracle: the day or month holding t in loc, drawn
// with time.Date alone (the zones tested change DST away from midnight).
func calendarPeriod(month bool, loc *time.Location, t time.Time) (start, end time.Time) {
	y, m, d := t.In(loc).Date()
	if month {
		return time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	return time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
}

// testCalendarMonth moves the clock through a month in zone from from,
// every hour and at every day's and month's boundary and the µs before
// it, spending 1 of a monthly policy (400) and of a daily one (20) at
// each, and demands each answer of a model counting per period: allowed
// while the period has room, and the reset (and a denial's retry) at
// the period's end to the microsecond. The month holds a DST change, so
// one day is 23 or 25 hours long.
func testCalendarMonth(t *testing.T, newStore newStoreFunc, zone, from string) {
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", zone, err)
	}
	begin, err := time.Parse(time.RFC3339, from)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, newStore,
		sluice.Policy{ID: "month", Algorithm: sluice.FixedWindow, Limit: 400, Period: "month", TimeZone: loc},
		sluice.Policy{ID: "day", Algorithm: sluice.FixedWindow, Limit: 20, Period: "day", TimeZone: loc})
	finish := begin.AddDate(0, 1, 5)
	var instants []time.Time
	for at := begin; at.Before(finish); at = at.Add(time.Hour) {
		instants = append(instants, at.Add(17*time.Minute+123*time.Microsecond))
		if _, end := calendarPeriod(false, loc, at); end.Sub(at) <= time.Hour {
			instants = append(instants, end.Add(-time.Microsecond), end)
		}
	}
	slices.SortFunc(instants, func(a, b time.Time) int { return a.Compare(b) })
	instants = slices.Compact(instants)
	type model struct {
		end   time.Time
		count int64
	}
	models := map[string]*model{"month": {}, "day": {}}
	limits := map[string]int64{"month": 400, "day": 20}
	var denials, rolls int
	for _, at := range instants {
		h.clock.Set(at)
		for _, id := range []string{"month", "day"} {
			m := models[id]
			_, end := calendarPeriod(id == "month", loc, at)
			if !end.Equal(m.end) {
				m.end, m.count = end, 0
				rolls++
			}
			w := want{kind: sluice.Denied, resetAfter: end.Sub(at)}
			if m.count < limits[id] {
				m.count++
				w.kind, w.remaining = sluice.Allowed, limits[id]-m.count
			} else {
				w.retryAfter = w.resetAfter
				denials++
			}
			o := h.check(id, 1, false)
			if got := (want{o.Kind, o.Remaining, o.RetryAfter, o.ResetAfter}); got != w {
				t.Fatalf("%s at %s (%s): Check(%q) = %+v (err %v), want %+v", zone, at.In(loc).Format(time.RFC3339Nano), at.UTC().Format(time.RFC3339Nano), id, got, o.Err, w)
			}
		}
	}
	if denials == 0 || rolls < 30 {
		t.Fatalf("%d instants: %d denials, %d periods: want both limits reached and every period crossed", len(instants), denials, rolls)
	}
}

// testCalendarOverride: a tenant on a plan of 100 a month uses 80, is
// raised to 1000 (920 left this month, reset at the month's end), then
// the next month starts afresh at 1000; a window on an override of a
// monthly policy is refused.
func testCalendarOverride(t *testing.T, newStore newStoreFunc) {
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, newStore, sluice.Policy{ID: "plan", Algorithm: sluice.FixedWindow, Limit: 100, Period: "month", TimeZone: loc})
	at := time.Date(2026, 3, 28, 12, 0, 0, 0, loc)
	h.clock.Set(at)
	end := time.Date(2026, 4, 1, 0, 0, 0, 0, loc)
	expect(t, "spend 80 of 100 this month", h.check("plan", 80, false), sluice.Allowed)
	h.setOverride(sluice.Override{Policy: "plan", Limit: 1000, Note: "upgraded"})
	h.run([]step{
		{"upgraded to 1000: 920 left this month", 0, "plan", 0, true, want{sluice.Allowed, 920, 0, end.Sub(at)}},
		{"across the DST change, spend 900", 48 * time.Hour, "plan", 900, false, want{sluice.Allowed, 20, 0, end.Sub(at.Add(48 * time.Hour))}},
		{"21 more: denied until the month's end", 0, "plan", 21, false, want{sluice.Denied, 20, end.Sub(at.Add(48 * time.Hour)), end.Sub(at.Add(48 * time.Hour))}},
	})
	h.clock.Set(end)
	next := time.Date(2026, 5, 1, 0, 0, 0, 0, loc)
	h.run([]step{{"April: 1000 afresh", 0, "plan", 1, false, want{sluice.Allowed, 999, 0, next.Sub(end)}}})
	err = h.limiter.SetOverride(context.Background(), sluice.Override{Policy: "plan", Subject: h.subject, Limit: 5, Window: time.Hour})
	if err == nil {
		t.Fatalf("SetOverride with a window on a monthly policy = nil, want an error naming the window")
	}
}
