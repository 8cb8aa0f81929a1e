package memstore_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

func newStore(t *testing.T, clock sluice.Clock) sluice.Store {
	s, err := memstore.New(memstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) { sluicetest.TestStore(t, newStore) }
