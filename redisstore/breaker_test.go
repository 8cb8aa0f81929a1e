package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestBreakerProbe: an open breaker PINGs until Redis answers, half-opens
// on the first answer without waiting out OpenFor, lets one decision
// through, and closes when it succeeds; the probe goroutine ends then,
// and on close while Redis still does not answer.
func TestBreakerProbe(t *testing.T) {
	before := runtime.NumGoroutine()
	var probes atomic.Int64
	var up atomic.Bool
	var mu sync.Mutex
	var states []string
	b := newBreaker(BreakerOptions{Failures: 2, OpenFor: time.Hour, ProbeEvery: time.Millisecond,
		OnChange: func(s string) { mu.Lock(); states = append(states, s); mu.Unlock() }},
		func(ctx context.Context) error {
			probes.Add(1)
			if up.Load() {
				return nil
			}
			return errors.New("dial tcp: connection refused")
		})
	down := fmt.Errorf("test: %w", sluice.FailedBeforeSend)
	b.roundTrip(down)
	b.roundTrip(down)
	if err := b.allow(); !errors.Is(err, sluice.CircuitOpen) {
		t.Fatalf("allow after 2 failures = %v, want CircuitOpen", err)
	}
	if !b.isOpen() {
		t.Fatal("isOpen = false after 2 failures")
	}
	eventually(t, "the probe PINGs", func() bool { return probes.Load() >= 3 })
	up.Store(true)
	eventually(t, "the probe half-opens the breaker", func() bool { return !b.isOpen() })
	if err := b.allow(); err != nil {
		t.Fatalf("allow once half open = %v, want one decision through (OpenFor is an hour)", err)
	}
	if err := b.allow(); !errors.Is(err, sluice.CircuitOpen) {
		t.Fatalf("a second allow while the first is out = %v, want CircuitOpen", err)
	}
	b.roundTrip(nil)
	if err := b.allow(); err != nil {
		t.Fatalf("allow after the trial succeeded = %v, want closed", err)
	}
	mu.Lock()
	got := slices.Clone(states)
	mu.Unlock()
	if fmt.Sprint(got) != "[open half_open closed]" {
		t.Fatalf("states %v, want [open half_open closed]", got)
	}
	// Open again with Redis down, then close the breaker: the probe stops.
	up.Store(false)
	b.roundTrip(down)
	b.roundTrip(down)
	reopened := probes.Load()
	eventually(t, "the probe PINGs again", func() bool { return probes.Load() > reopened })
	b.close() // returns once the probe goroutine has ended
	b.mu.Lock()
	probing := b.probing
	b.mu.Unlock()
	if n := probes.Load(); probing || b.probeCtx.Err() == nil {
		t.Fatalf("after close: probing %v, probe context %v (%d PINGs): want the probe stopped", probing, b.probeCtx.Err(), n)
	}
	b.roundTrip(down) // opening after close starts no probe
	eventually(t, "goroutines back to where they were", func() bool { return runtime.NumGoroutine() <= before })
}

// TestBreakerWithoutProbe: ProbeEvery < 0 leaves OpenFor alone to
// half-open the breaker.
func TestBreakerWithoutProbe(t *testing.T) {
	b := newBreaker(BreakerOptions{Failures: 1, OpenFor: 10 * time.Millisecond, ProbeEvery: -1}, func(context.Context) error {
		t.Error("probed with ProbeEvery < 0")
		return nil
	})
	b.roundTrip(fmt.Errorf("test: %w", sluice.ErrIndeterminate))
	if err := b.allow(); !errors.Is(err, sluice.CircuitOpen) {
		t.Fatalf("allow once open = %v, want CircuitOpen", err)
	}
	eventually(t, "OpenFor half-opens it", func() bool { return b.allow() == nil })
	b.close()
}

// eventually waits, a bounded number of times, for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within 5s", what)
}
