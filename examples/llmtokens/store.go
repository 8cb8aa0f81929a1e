package main

import "github.com/sluicehq/sluice/memstore"

// newStore returns the embedded store; a fleet of proxies would share a
// redisstore.Store instead.
func newStore() (*memstore.Store, error) { return memstore.New(memstore.Options{}) }
