// Package period is the calendar of sluice's calendar periods: where a
// minute, hour, day, ISO week, month or year begins and ends in a time
// zone, in the engine's integer µs since the Unix epoch.
//
// The engine never reads a calendar: a store asks Bounds for the periods
// around its caller's clock (the one before the period holding now, that
// period and the one after it) and hands their four boundaries to the
// engine (algorithm.Params.Bounds), which opens a fixed window on the one
// holding the time it decides at. On Redis time the script does the same
// with Redis's clock, and refuses when that clock lies outside all three
// (the caller's clock is then off by more than a period).
//
// Days, weeks, months and years begin at local midnight (time.Date's
// answer for 00:00 where a DST change skips it), weeks on Monday; minutes
// and hours begin where the local clock reads :00, so a DST change makes
// a day 23 or 25 hours long and a month that holds one an hour shorter or
// longer, and a month is 28 to 31 days.
package period

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Unit is a calendar period's length.
type Unit uint8

// The units. The zero value is no period.
const (
	Minute Unit = iota + 1
	Hour
	Day
	Week
	Month
	Year
)

var names = [...]string{Minute: "minute", Hour: "hour", Day: "day", Week: "week", Month: "month", Year: "year"}

// String returns the config spelling, e.g. "month".
func (u Unit) String() string {
	if u >= Minute && u <= Year {
		return names[u]
	}
	return fmt.Sprintf("Unit(%d)", uint8(u))
}

// namesRule is the rule a bad period name breaks, for error messages.
const namesRule = "must be one of minute, hour, day, week, month, year"

// Parse returns the unit spelled s ("month"), or false.
func Parse(s string) (Unit, bool) {
	for u := Minute; u <= Year; u++ {
		if names[u] == s {
			return u, true
		}
	}
	return 0, false
}

// Nominal is u's length without DST changes, leap days or the months'
// lengths (a month counts 31 days, a year 365): what RateLimit-Policy
// and the math's checks take as its window.
func (u Unit) Nominal() time.Duration {
	switch u {
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 31 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// start returns the start of the period of u holding t in loc.
func start(u Unit, loc *time.Location, t time.Time) time.Time {
	l := t.In(loc)
	switch u {
	case Minute:
		return t.Add(-time.Duration(l.Second())*time.Second - time.Duration(l.Nanosecond()))
	case Hour:
		return t.Add(-time.Duration(l.Minute())*time.Minute - time.Duration(l.Second())*time.Second - time.Duration(l.Nanosecond()))
	}
	y, m, d := l.Date()
	switch u {
	case Week:
		d -= (int(l.Weekday()) + 6) % 7 // back to Monday
	case Month:
		d = 1
	case Year:
		m, d = time.January, 1
	}
	s := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if s.After(t) { // 00:00 skipped by a DST change, answered after t: the day began at t's offset
		s = t.Add(-time.Duration(l.Hour())*time.Hour - time.Duration(l.Minute())*time.Minute - time.Duration(l.Second())*time.Second - time.Duration(l.Nanosecond()))
	}
	return s
}

// next returns the start of the period of u after the one starting at s.
func next(u Unit, loc *time.Location, s time.Time) time.Time {
	var n time.Time
	switch u {
	case Minute, Hour:
		n = start(u, loc, s.Add(u.Nominal()))
	default:
		l := s.In(loc)
		y, m, d := l.Date()
		switch u {
		case Day:
			d++
		case Week:
			d += 7
		case Month:
			m++
		case Year:
			y++
		}
		n = start(u, loc, time.Date(y, m, d, 12, 0, 0, 0, loc)) // noon: never skipped
	}
	if !n.After(s) { // no zone shortens a period to nothing; held anyway
		n = s.Add(u.Nominal())
	}
	return n
}

// Bounds returns, in µs since the Unix epoch, the start of the period of
// u before the one holding now (µs), the start of that one, the start of
// the next and its end: b[0] < b[1] <= now < b[2] < b[3].
func Bounds(u Unit, loc *time.Location, now int64) [4]int64 {
	t := time.UnixMicro(now)
	cur := start(u, loc, t)
	nx := next(u, loc, cur)
	for i := 0; i < 4 && !nx.After(t); i++ {
		// A DST change of half an hour (Australia/Lord_Howe) starts the
		// local hour after cur before t: t lies in that one.
		cur, nx = nx, next(u, loc, nx)
	}
	prev := start(u, loc, cur.Add(-time.Microsecond))
	return [4]int64{prev.UnixMicro(), cur.UnixMicro(), nx.UnixMicro(), next(u, loc, nx).UnixMicro()}
}

// Cache keeps the Bounds last computed for each unit and zone, reused
// while the time asked lies in the same period: a store asks for every
// decision, and a calendar costs four time.Date calls. Safe for
// concurrent use; the zero value is empty.
type Cache struct {
	m sync.Map // zone → *atomic.Pointer[[4]int64]
}

type cacheKey struct {
	u   Unit
	loc *time.Location
}

// Bounds returns Bounds(u, loc, now), from the cache when now lies in the
// period it holds.
func (c *Cache) Bounds(u Unit, loc *time.Location, now int64) [4]int64 {
	k := cacheKey{u, loc}
	v, ok := c.m.Load(k)
	if !ok {
		v, _ = c.m.LoadOrStore(k, new(atomic.Pointer[[4]int64]))
	}
	ptr := v.(*atomic.Pointer[[4]int64])
	if b := ptr.Load(); b != nil && b[1] <= now && now < b[2] {
		return *b
	}
	b := Bounds(u, loc, now)
	ptr.Store(&b)
	return b
}

// CheckPolicy returns the field, value as written and rule that a
// policy's period settings break, or field "": name (a Unit's spelling,
// "" for none) and zone (nil: UTC) on a policy of algorithm alg with
// window, clock alignment and local quota as given. Only fixed_window
// counts per period; the other algorithms are refused with the reason.
func CheckPolicy(name string, zone *time.Location, alg string, window time.Duration, aligned, localQuota bool) (field, value, rule string) {
	if name == "" {
		if zone != nil {
			return "time_zone", zone.String(), "applies only with a period; set period, or leave time_zone unset"
		}
		return "", "", ""
	}
	if _, ok := Parse(name); !ok {
		return "period", fmt.Sprintf("%q", name), namesRule
	}
	switch alg {
	case "fixed_window":
	case "token_bucket", "gcra":
		return "period", name, alg + " refills continuously: a refill of limit per " + name + " is no calendar quota (nothing resets when the " + name + " begins, and its rate would change with the " + name + "'s length); use fixed_window for a quota per " + name + ", or a window for a rate"
	case "sliding_window", "sliding_log":
		return "period", name, alg + " slides: it has no boundary to reset at when the " + name + " begins; use fixed_window for a quota per " + name
	default:
		return "period", name, "does not apply to " + alg + ", which limits leases held at once, not units per period"
	}
	switch {
	case window != 0:
		return "window", window.String(), "must not be set with a period: the period is the window"
	case aligned:
		return "align", "clock", "must not be set with a period: a period is aligned to the calendar already"
	case localQuota:
		return "local_quota", "true", "does not apply to a calendar period yet: a block would have to end at the period's end"
	}
	return "", "", ""
}
