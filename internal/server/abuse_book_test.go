package server_test

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestAbuseBook plays the caller of the book row of docs/security.md: a
// client holding only the check scope books a shared subject of gcra
// 10/s, whose operator set max_wait 1s, asking to wait a day
// (max_wait_ms 86400000) 300 times with a cost of 10. The bound: no
// booking lies more than the policy's max_wait ahead (the client may ask
// for less, never more), so every other caller of that subject is
// admitted again within about a second, on both stores.
func TestAbuseBook(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testAbuseBook(t, "") })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testAbuseBook(t, fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\" } }\n", srv.Addr))
	})
}

func testAbuseBook(t *testing.T, store string) {
	url := startOverrideServer(t, `server:
  listen: 127.0.0.1:0
  auth:
    tokens:
      - { id: app, secret_env: OVR_CHECK, scopes: [check] }
subjects:
  hmac_keys:
    - { id: k1, secret_env: OVR_HMAC }
`+store+`
policies:
  - { id: shared, algorithm: gcra, limit: 10, window: 1s, max_wait: 1s }
`)
	const greedy = `{"policy":"shared","subject":"team","op":"book","cost":10,"max_wait_ms":86400000}`
	booked := 0
	for i := range 300 {
		code, body := call(t, "POST", url+"/v1/check", ovrCheckToken, greedy)
		a, err := checkapi.ParseAnswer([]byte(body))
		switch {
		case err != nil || code != 200 && code != 429:
			t.Fatalf("book %d: %d %s (%v), want 200 or 429", i, code, body, err)
		case code == 200 && a.DelayMS > 1000:
			t.Fatalf("book %d of cost 10 asking for max_wait_ms 86400000: 200 with delay_ms %d, want at most the policy's max_wait, 1000", i, a.DelayMS)
		case code == 200:
			booked++
		}
	}
	if booked == 0 {
		t.Fatal("no book admitted: want the burst now and the slots within max_wait")
	}
	code, body := call(t, "POST", url+"/v1/check", ovrCheckToken, `{"policy":"shared","subject":"team"}`)
	a, err := checkapi.ParseAnswer([]byte(body))
	if err != nil || code != 429 || a.RetryAfterMS > 2000 {
		t.Fatalf("another caller's check after the books: %d %s (%v), want 429 with retry_after_ms at most 2000 (what max_wait lets be booked ahead, and its cost)", code, body, err)
	}
}
