package redistest

import (
	"os"
	"testing"
)

// Long skips t unless SLUICE_LONG is set (make test sets it): the long
// process tests (a Redis Cluster's failover, several processes, a
// browser, the README's commands end to end) are left out of a plain
// go test ./..., which stays short, and all run in make test.
func Long(t testing.TB) {
	t.Helper()
	if os.Getenv("SLUICE_LONG") == "" {
		t.Skip("a long process test: set SLUICE_LONG=1 to run it (make test does)")
	}
}
