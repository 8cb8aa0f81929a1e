package period

import (
	"testing"
	"time"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v (the machine needs tzdata)", name, err)
	}
	return loc
}

func TestBoundsAcrossDSTAndMonthEnds(t *testing.T) {
	berlin, newYork := zone(t, "Europe/Berlin"), zone(t, "America/New_York")
	at := func(s string) int64 {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v.UnixMicro()
	}
	for _, c := range []struct {
		name string
		u    Unit
		loc  *time.Location
		now  string
		want [4]string
	}{
		{"berlin month holding spring DST", Month, berlin, "2026-03-29T12:00:00+02:00",
			[4]string{"2026-02-01T00:00:00+01:00", "2026-03-01T00:00:00+01:00", "2026-04-01T00:00:00+02:00", "2026-05-01T00:00:00+02:00"}},
		{"berlin day of spring DST, 23h", Day, berlin, "2026-03-29T04:00:00+02:00",
			[4]string{"2026-03-28T00:00:00+01:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-03-31T00:00:00+02:00"}},
		{"berlin hour after spring DST", Hour, berlin, "2026-03-29T03:30:00+02:00",
			[4]string{"2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00", "2026-03-29T05:00:00+02:00"}},
		{"new york day of autumn DST, 25h", Day, newYork, "2026-11-01T01:30:00-05:00",
			[4]string{"2026-10-31T00:00:00-04:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", "2026-11-03T00:00:00-05:00"}},
		{"new york second 1am hour", Hour, newYork, "2026-11-01T01:30:00-05:00",
			[4]string{"2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00", "2026-11-01T03:00:00-05:00"}},
		{"new york month at its first µs", Month, newYork, "2026-11-01T00:00:00-04:00",
			[4]string{"2026-10-01T00:00:00-04:00", "2026-11-01T00:00:00-04:00", "2026-12-01T00:00:00-05:00", "2027-01-01T00:00:00-05:00"}},
		{"utc february of a leap year", Month, time.UTC, "2028-02-29T23:59:59Z",
			[4]string{"2028-01-01T00:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", "2028-04-01T00:00:00Z"}},
		{"iso week from monday", Week, berlin, "2026-12-06T23:00:00+01:00", // a Sunday
			[4]string{"2026-11-23T00:00:00+01:00", "2026-11-30T00:00:00+01:00", "2026-12-07T00:00:00+01:00", "2026-12-14T00:00:00+01:00"}},
		{"year", Year, newYork, "2026-12-31T23:59:59-05:00",
			[4]string{"2025-01-01T00:00:00-05:00", "2026-01-01T00:00:00-05:00", "2027-01-01T00:00:00-05:00", "2028-01-01T00:00:00-05:00"}},
		{"minute", Minute, time.UTC, "2026-12-05T07:08:13.5Z",
			[4]string{"2026-12-05T07:07:00Z", "2026-12-05T07:08:00Z", "2026-12-05T07:09:00Z", "2026-12-05T07:10:00Z"}},
	} {
		got := Bounds(c.u, c.loc, at(c.now))
		var want [4]int64
		for i, s := range c.want {
			want[i] = at(s)
		}
		if got != want {
			t.Errorf("%s: Bounds(%v, %v, %s) = %v, want %v", c.name, c.u, c.loc, c.now, got, want)
		}
		// One µs before the start, the period is the one before.
		if b := Bounds(c.u, c.loc, want[1]-1); b[1] != want[0] || b[2] != want[1] {
			t.Errorf("%s: Bounds one µs before the start = %v, want the period [%d, %d)", c.name, b, want[0], want[1])
		}
	}
}

func TestParse(t *testing.T) {
	for u := Minute; u <= Year; u++ {
		if got, ok := Parse(u.String()); !ok || got != u {
			t.Errorf("Parse(%q) = %v, %t, want %v", u.String(), got, ok, u)
		}
	}
	if _, ok := Parse("fortnight"); ok {
		t.Errorf("Parse(fortnight) = ok, want refused")
	}
}

func TestCacheFollowsThePeriod(t *testing.T) {
	var c Cache
	now := time.Date(2026, 1, 31, 23, 59, 59, 0, time.UTC).UnixMicro()
	for _, n := range []int64{now, now + 999_999, now + 1_000_000, now + 2_000_000, now} {
		if got, want := c.Bounds(Month, time.UTC, n), Bounds(Month, time.UTC, n); got != want {
			t.Errorf("Cache.Bounds(month, %d) = %v, want %v", n, got, want)
		}
	}
}

// TestBoundsHoldNow: in zones with DST changes of an hour and of half an
// hour, and off UTC by a half or three quarters of an hour, every unit's
// bounds around a time of each day of 2026 (and of its DST days, every
// 7 minutes) hold it: b0 < b1 <= now < b2 < b3.
func TestBoundsHoldNow(t *testing.T) {
	for _, name := range []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "Asia/Kathmandu", "America/Santiago"} {
		loc := zone(t, name)
		from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		step := 7*time.Minute + 13*time.Second
		for at := from; at.Before(from.AddDate(1, 0, 0)); at = at.Add(step) {
			if _, off := at.In(loc).Zone(); step < time.Hour {
				if _, off2 := at.Add(36 * time.Hour).In(loc).Zone(); off == off2 {
					step = 6*time.Hour + 17*time.Minute // no change near: move faster
				}
			} else if _, off2 := at.Add(36 * time.Hour).In(loc).Zone(); off != off2 {
				step = 7*time.Minute + 13*time.Second // a change ahead: every 7 minutes
			}
			now := at.UnixMicro()
			for u := Minute; u <= Year; u++ {
				b := Bounds(u, loc, now)
				if !(b[0] < b[1] && b[1] <= now && now < b[2] && b[2] < b[3]) {
					t.Fatalf("%s %v at %s: Bounds = %v, want b0 < b1 <= %d < b2 < b3", name, u, at.In(loc).Format(time.RFC3339), b, now)
				}
			}
		}
	}
}
