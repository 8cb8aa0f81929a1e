package envoyrlqs_test

import (
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
)

// usage is a report's line for one bucket, as the tests compare it.
type usage struct {
	key             string
	allowed, denied uint64
	elapsedSeconds  int64
}

func usages(r *rlqspb.RateLimitQuotaUsageReports) []usage {
	var out []usage
	for _, u := range r.GetBucketQuotaUsages() {
		out = append(out, usage{envoyrlqs.Key(u.GetBucketId().GetBucket()), u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), u.GetTimeElapsed().GetSeconds()})
	}
	return out
}

// TestReports: a new bucket is reported at once (time_elapsed 0 s), then
// every bucket every 5 virtual seconds with the counts since its last
// report and the whole seconds since it; every report names the domain.
func TestReports(t *testing.T) {
	ctx := guard(t)
	s := startServer(t)
	p := dial(t, s, envoyrlqs.Options{Domain: "edge"})
	web := map[string]string{"route": "web"}
	p.Admit(api)
	p.Advance(2 * time.Second)
	admit(p, api, 2)
	p.Admit(web)
	p.Advance(3 * time.Second) // the timer, started by the first bucket at 0 s, fires at 5 s
	p.Advance(5 * time.Second) // and at 10 s: nothing happened since
	got := s.awaitReports(ctx, t, 4)
	want := [][]usage{
		{{envoyrlqs.Key(api), 1, 0, 0}},
		{{envoyrlqs.Key(web), 1, 0, 0}},
		{{envoyrlqs.Key(api), 2, 0, 5}, {envoyrlqs.Key(web), 0, 0, 3}},
		{{envoyrlqs.Key(api), 0, 0, 5}, {envoyrlqs.Key(web), 0, 0, 5}},
	}
	for i, r := range got {
		if r.GetDomain() != "edge" {
			t.Errorf("report %d: domain %q, want edge", i, r.GetDomain())
		}
		if g := usages(r); !equalUsages(g, want[i]) {
			t.Errorf("report %d = %+v, want %+v", i, g, want[i])
		}
	}
}

func equalUsages(a, b []usage) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAbandonStartsOver: after abandon_action the bucket's next request is
// a first request again: decided by no_assignment_behavior, reported at
// once.
func TestAbandonStartsOver(t *testing.T) {
	ctx := guard(t)
	s := startServer(t)
	s.assign(api, envoyrlqs.DenyAll(), time.Hour)
	p := dial(t, s, envoyrlqs.Options{})
	p.Admit(api)
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	s.send(ctx, t, p, abandon(api))
	if !p.Admit(api) {
		t.Error("Admit after abandon_action = false, want true (no assignment: ALLOW_ALL)")
	}
	got := s.awaitReports(ctx, t, 2)
	if u := usages(got[1]); !equalUsages(u, []usage{{envoyrlqs.Key(api), 1, 0, 0}}) {
		t.Errorf("report after abandon = %+v, want a first report", u)
	}
}

// TestStreamEnd: when the server ends the stream the assignments stay in
// force until their TTL, a report sent and unanswered makes Await fail,
// and the next periodic report opens a new stream.
func TestStreamEnd(t *testing.T) {
	ctx := guard(t)
	s := startServer(t)
	s.assign(api, envoyrlqs.DenyAll(), 20*time.Second)
	p := dial(t, s, envoyrlqs.Options{})
	p.Admit(api)
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	web := map[string]string{"route": "web"} // reported, never answered
	p.Admit(web)
	s.awaitReports(ctx, t, 2)
	s.end <- struct{}{}
	if err := p.Await(ctx); !isEnded(err) {
		t.Fatalf("Await = %v, want ErrStreamEnded", err)
	}
	if opened, ends := p.Streams(); opened != 1 || len(ends) != 1 {
		t.Errorf("Streams() = %d, %v; want 1 opened, 1 end", opened, ends)
	}
	if st := p.State(api); st.Phase != envoyrlqs.Assignment || p.Admit(api) {
		t.Errorf("after the stream's end: state %+v, want the DENY_ALL assignment still in force", st)
	}
	p.Advance(5 * time.Second)
	s.awaitReports(ctx, t, 3)
	if opened, _ := p.Streams(); opened != 2 {
		t.Errorf("after the periodic report: %d streams opened, want 2", opened)
	}
}

// TestFleetMostAdmitted counts a fleet's admissions in closed virtual
// intervals.
func TestFleetMostAdmitted(t *testing.T) {
	s := startServer(t) // answers nothing: ALLOW_ALL throughout
	f, err := envoyrlqs.NewFleet([]string{s.addr, s.addr}, envoyrlqs.Options{Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	admit(f.Proxies[0], api, 3) // at 0 s
	f.Advance(time.Second)
	admit(f.Proxies[1], api, 2) // at 1 s
	f.Advance(time.Second)
	admit(f.Proxies[0], api, 4) // at 2 s
	for _, c := range []struct {
		window time.Duration
		most   int
		at     time.Duration
	}{{0, 4, 2 * time.Second}, {time.Second, 6, time.Second}, {2 * time.Second, 9, 0}} {
		if most, at := f.MostAdmitted(api, c.window); most != c.most || at != c.at {
			t.Errorf("MostAdmitted(window %v) = %d at %v, want %d at %v", c.window, most, at, c.most, c.at)
		}
	}
	if n := f.Admitted(api, time.Second, 2*time.Second); n != 6 {
		t.Errorf("Admitted([1s, 2s]) = %d, want 6", n)
	}
}
