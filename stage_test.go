package sluice

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/form"
)

// TestMostRestrictive: the one choice of the status that speaks for
// several: a denial over any admission, of denials the longest wait, of
// admissions the fewest left and, as few left, the later reset; of two
// alike the first. form.MostRestrictive, through which the Envoy service
// makes it across checks, is this choice.
func TestMostRestrictive(t *testing.T) {
	allowed := func(remaining int64, reset time.Duration) Status {
		return Status{Allowed: true, Limit: 10, Remaining: remaining, ResetAfter: reset}
	}
	denied := func(retry time.Duration) Status {
		return Status{Limit: 10, ResetAfter: time.Hour, RetryAfter: retry}
	}
	for _, tc := range []struct {
		name string
		ss   []Status
		want int
	}{
		{"one", []Status{allowed(5, time.Second)}, 0},
		{"a denial after an admission", []Status{allowed(0, time.Hour), denied(time.Second)}, 1},
		{"an admission after a denial", []Status{denied(time.Second), allowed(0, time.Hour)}, 0},
		{"the longest wait", []Status{denied(time.Second), denied(time.Minute), denied(30 * time.Second)}, 1},
		{"as long a wait: the first", []Status{denied(time.Minute), denied(time.Minute)}, 0},
		{"the fewest left", []Status{allowed(5, time.Hour), allowed(2, time.Second), allowed(3, time.Minute)}, 1},
		{"as few left: the later reset", []Status{allowed(2, time.Second), allowed(2, time.Minute), allowed(2, 30*time.Second)}, 1},
		{"alike: the first", []Status{allowed(2, time.Minute), allowed(2, time.Minute)}, 0},
		{"a denial among admissions", []Status{allowed(1, time.Hour), denied(time.Millisecond), allowed(0, time.Hour)}, 1},
	} {
		if got := mostRestrictive(tc.ss); got != tc.want {
			t.Errorf("%s: mostRestrictive = %d, want %d", tc.name, got, tc.want)
		}
		if got := form.MostRestrictive(tc.ss); got != tc.want {
			t.Errorf("%s: form.MostRestrictive = %d, want %d", tc.name, got, tc.want)
		}
	}
}
