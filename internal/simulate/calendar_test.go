package simulate

import "testing"

// TestCalendarIsExactPerPeriod: on the calendar pattern (a Berlin month
// with its change to summer time and a month's end), fixed_window with a
// period admits exactly what the count per Berlin day or month admits,
// never more than the limit in one, and every denial's Retry-After runs
// to the period's end to the µs; a 24h window on UTC midnights does not
// (it counts other days than Berlin's, and resets an hour or two off).
func TestCalendarIsExactPerPeriod(t *testing.T) {
	rows, err := RunCalendar(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		t.Logf("%+v", r)
	}
	for _, i := range []int{0, 2} {
		r := rows[i]
		if r.FalseAdmits != 0 || r.FalseDenials != 0 || int64(r.Most) > r.Limit || r.Denials == 0 || r.ExactResets != r.Denials {
			t.Errorf("%s: %+v, want no false admission or denial, at most %d a period, denials each reset at the period's end", r.Name, r, r.Limit)
		}
	}
	if r := rows[1]; r.FalseAdmits == 0 || r.FalseDenials == 0 || r.ExactResets != 0 {
		t.Errorf("%s: %+v, want UTC days to decide otherwise than Berlin's and reset elsewhere", r.Name, r)
	}
}
