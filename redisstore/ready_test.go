package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisstore"
)

// waitReady asks s.Ready until it answers nil, a bounded number of
// times: the code is then loaded on every master. New does not load it,
// so a test that counts or orders what reaches Redis from the first
// decision on waits for this first.
func waitReady(t testing.TB, s *redisstore.Store) {
	t.Helper()
	var err error
	for range 250 {
		if err = s.Ready(context.Background()); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("store not ready: %v", err)
}
