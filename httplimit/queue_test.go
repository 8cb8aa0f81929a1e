package httplimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestMaxDelayRefusedAtConstruction: a route's queue is checked when the
// middleware is built: one gcra or token_bucket policy, a whole number of
// ms, not beside Shadow or SettleHeader.
func TestMaxDelayRefusedAtConstruction(t *testing.T) {
	lim := newLimiter(t, sluicetest.NewClock(),
		sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second},
		sluice.Policy{ID: "pages", Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Minute})
	for _, c := range []struct {
		route httplimit.Route
		want  string
	}{
		{httplimit.Route{Policies: []string{"api"}, MaxDelay: 500 * time.Millisecond}, ""},
		{httplimit.Route{Policies: []string{"pages"}, MaxDelay: 500 * time.Millisecond}, `policy "pages" is fixed_window: only gcra and token_bucket have a future slot to book`},
		{httplimit.Route{Policies: []string{"api", "pages"}, MaxDelay: time.Second}, "one policy, not of 2"},
		{httplimit.Route{Policies: []string{"api"}, MaxDelay: 1500 * time.Microsecond}, "whole number of milliseconds"},
		{httplimit.Route{Policies: []string{"api"}, MaxDelay: 2 * time.Second}, `is more than policy "api"'s MaxWait (1s), which bounds every booking`},
		{httplimit.Route{Policies: []string{"api"}, QueueLimit: 5}, "Routes[0].MaxDelay = 0s: must be a whole number of milliseconds"},
		{httplimit.Route{Policies: []string{"api"}, MaxDelay: time.Second, Shadow: true}, "not with Shadow or SettleHeader"},
	} {
		_, err := httplimit.New(lim, httplimit.Options{Routes: []httplimit.Route{c.route}})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("New(%+v) = %v, want nil", c.route, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("New(%+v) = %v, want an error saying %q", c.route, err, c.want)
		}
	}
}
