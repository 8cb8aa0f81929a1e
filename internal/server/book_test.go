package server_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/server"
)

// TestCheckAPIBook: "op": "book" spends now within the burst, then books
// the next slots, answered with delay_ms; past the policy's max_wait (or
// max_wait_ms when less: a client may ask for less, never more) it is
// denied, booking nothing; a book on a window
// algorithm, with an evaluation_id, or a max_wait_ms without it is
// refused with its reason. Every exchange is validated against
// openapi.yaml (the fixture's handler is wrapped in validating).
func TestCheckAPIBook(t *testing.T) {
	policies := []sluice.Policy{
		{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 2, MaxWait: 25 * time.Millisecond}, // a slot every 10ms
		{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second},
	}
	f := newFixture(t, policies, server.Options{})
	for i, want := range []int64{0, 0, 10} {
		if resp, a := f.post(t, `{"policy":"api","subject":"w","op":"book"}`); resp.StatusCode != 200 || a.DelayMS != want {
			t.Fatalf("book %d: %d %+v, want 200 with delay_ms %d", i, resp.StatusCode, a, want)
		}
	}
	if resp, a := f.post(t, `{"policy":"api","subject":"w","op":"book","max_wait_ms":15}`); resp.StatusCode != 429 || a.RetryAfterMS != 20 || a.DelayMS != 0 {
		t.Fatalf("book past its max_wait_ms 15: %d %+v, want 429, retry after 20ms", resp.StatusCode, a)
	}
	if resp, a := f.post(t, `{"policy":"api","subject":"w","op":"book","max_wait_ms":40}`); resp.StatusCode != 200 || a.DelayMS != 20 {
		t.Fatalf("book with max_wait_ms 40: %d %+v, want 200 with delay_ms 20 (the denial booked nothing)", resp.StatusCode, a)
	}
	if resp, a := f.post(t, `{"policy":"api","subject":"w","op":"book","max_wait_ms":40}`); resp.StatusCode != 429 || a.RetryAfterMS != 30 || a.DelayMS != 0 {
		t.Fatalf("book with max_wait_ms 40, its slot 30ms ahead: %d %+v, want 429, retry after 30ms: held to the policy's max_wait, 25ms", resp.StatusCode, a)
	}
	f.check(t, `{"policy":"demo","subject":"w","op":"book"}`, 400, "only gcra and token_bucket have a future slot to book")
	f.check(t, `{"policy":"api","subject":"w","op":"book","evaluation_id":"e"}`, 400, "a book takes none")
	f.check(t, `{"policy":"api","subject":"w","max_wait_ms":10}`, 400, "only a book waits")
}
