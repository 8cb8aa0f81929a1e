package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/memstore"
)

// storeHandle is a store built from the config with what serve needs
// around it.
type storeHandle struct {
	store sluice.Store
	ready []server.Check // readiness checks for GET /readyz
	close func() error
}

// newStore builds the store the config names. It is the one place where
// store types are wired into the binary.
func newStore(ctx context.Context, cfg *config.Config, clock sluice.Clock, getenv func(string) string) (*storeHandle, error) {
	switch cfg.Store.Type {
	case config.StoreMemory:
		ms, err := memstore.New(memstore.Options{Clock: clock})
		if err != nil {
			return nil, fmt.Errorf("store type memory: %w", err)
		}
		return &storeHandle{store: ms, close: ms.Close}, nil
	case config.StoreRedis:
		return nil, errors.New("store type redis: not built into this binary yet")
	}
	return nil, fmt.Errorf("store type %q: unknown", cfg.Store.Type)
}
