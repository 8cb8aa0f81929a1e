package envoyrlqs_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/envoyrlqs"
)

// TestRedirect: a Proxy redirected to another server keeps its bucket and
// the assignment in force, cuts the stream it had, and sends its next
// report to the new server on a new stream.
func TestRedirect(t *testing.T) {
	ctx := guard(t)
	first, second := startServer(t), startServer(t)
	first.assign(api, tb(5, 1, time.Second), time.Minute)
	p := dial(t, first, envoyrlqs.Options{Domain: "edge"})
	p.Admit(api)
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Redirect(second.addr); err != nil {
		t.Fatal(err)
	}
	if opened, ends := p.Streams(); opened != 1 || len(ends) != 1 {
		t.Fatalf("after Redirect: %d streams opened, ends %v; want 1 opened, 1 ended", opened, ends)
	}
	if st := p.State(api); st.Phase != envoyrlqs.Assignment || st.Strategy.GetTokenBucket().GetMaxTokens() != 5 {
		t.Fatalf("after Redirect the bucket is %+v, want the first server's assignment kept", st)
	}
	p.Advance(5 * time.Second)
	got := usages(second.awaitReports(ctx, t, 1)[0])
	if len(got) != 1 || got[0].key != envoyrlqs.Key(api) || got[0].allowed != 0 || got[0].elapsedSeconds != 5 {
		t.Fatalf("the second server got %+v, want the periodic report of %s", got, envoyrlqs.Key(api))
	}
	if opened, _ := p.Streams(); opened != 2 {
		t.Fatalf("%d streams opened, want 2: the report opens one to the new server", opened)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Redirect(second.addr); err == nil {
		t.Fatal("Redirect after Close: no error, want one")
	}
}
