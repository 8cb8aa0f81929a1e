package httplimit_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestRoutePriority: two routes share the operation "api" and so one
// budget of 4 per hour whose sheddable class may use 50 %: /batch is
// sheddable, / takes its class from X-Priority through PriorityFunc
// (critical when absent). Two batch requests pass and the third is 429
// while the budget left is the reserved part; critical requests then get
// the other two. Decision.Priority says which class decided.
func TestRoutePriority(t *testing.T) {
	l := newLimiter(t, sluicetest.NewClock(), sluice.Policy{ID: "p", Algorithm: sluice.FixedWindow, Limit: 4, Window: time.Hour,
		Priorities: map[string]int{"critical": 100, "sheddable": 50}})
	fromHeader := func(r *http.Request) string { return r.Header.Get("X-Priority") }
	m := newMiddleware(t, l, httplimit.Options{Routes: []httplimit.Route{
		{Operation: "api", PathPrefix: "/batch", Policies: []string{"p"}, Priority: "sheddable"},
		{Operation: "api", PathPrefix: "/", Policies: []string{"p"}, Priority: "critical", PriorityFunc: fromHeader},
	}})
	classes := make(chan string, 8)
	srv := serveWith(t, m, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := httplimit.FromContext(r.Context())
		classes <- d.Priority
	}))
	for i, want := range []int{200, 200, 429} {
		if code, _, _ := get(t, srv, "/batch"); code != want {
			t.Fatalf("batch request %d = %d, want %d", i+1, code, want)
		}
	}
	if code, _, _ := get(t, srv, "/x", "X-Priority: sheddable"); code != 429 {
		t.Fatalf("a request naming sheddable by header = %d, want 429", code)
	}
	for i, want := range []int{200, 200, 429} {
		if code, _, _ := get(t, srv, "/x"); code != want {
			t.Fatalf("critical request %d = %d, want %d", i+1, code, want)
		}
	}
	close(classes)
	var got []string
	for c := range classes {
		got = append(got, c)
	}
	if strings.Join(got, ",") != "sheddable,sheddable,critical,critical" {
		t.Errorf("the classes the admitted requests were decided as = %v, want sheddable twice, then critical twice", got)
	}
	_, err := httplimit.New(l, httplimit.Options{Routes: []httplimit.Route{{Policies: []string{"p"}, Priority: "bulk"}}})
	if err == nil || !strings.Contains(err.Error(), `Routes[0].Priority = "bulk": must be a priority class one of the policies declares`) {
		t.Errorf("New with an undeclared class = %v, want an error naming Routes[0].Priority, its value and the rule", err)
	}
}
