package logthrottle

import (
	"sync"
	"testing"
	"time"
)

func TestThrottle(t *testing.T) {
	th := Throttle{Burst: 2}
	t0 := time.Unix(1000, 0)
	for i := range 2 {
		if ok, n := th.Allow(t0); !ok || n != 0 {
			t.Fatalf("record %d = %v, %d; want let through, 0 held back", i, ok, n)
		}
	}
	for i := range 5 {
		if ok, _ := th.Allow(t0.Add(time.Duration(i) * 100 * time.Millisecond)); ok {
			t.Fatalf("record %d beyond the burst within the second let through", i)
		}
	}
	if ok, n := th.Allow(t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("a second later = %v, %d; want let through, 5 held back", ok, n)
	}
	if ok, n := th.Allow(t0.Add(time.Second)); !ok || n != 0 {
		t.Fatalf("the next = %v, %d; want let through, none held back since", ok, n)
	}
}

// written is one call of Latest.Write.
type written struct {
	state      string
	suppressed int64
}

func TestLatest(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	out := make(chan written, 10)
	l := &Latest{Every: time.Millisecond, Now: clock, Write: func(s string, n int64) { out <- written{s, n} }}
	defer l.Stop()
	next := func(what string) written {
		t.Helper()
		select {
		case w := <-out:
			return w
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: nothing written", what)
			return written{}
		}
	}
	l.Record("open")
	if w := next("the first change"); w != (written{"open", 0}) {
		t.Fatalf("first change wrote %+v, want open, 0 held back", w)
	}
	// A flapping breaker within the interval: held back, then the last
	// state is written when the interval is over, not before.
	l.Record("half_open")
	l.Record("open")
	l.Record("closed")
	select {
	case w := <-out:
		t.Fatalf("wrote %+v before the interval was over on Now's clock", w)
	default:
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if w := next("the held-back changes"); w != (written{"closed", 2}) {
		t.Fatalf("after the interval wrote %+v, want closed with 2 held back", w)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	l.Record("open")
	if w := next("a change after a quiet interval"); w != (written{"open", 0}) {
		t.Fatalf("after a quiet interval wrote %+v, want open at once, 0 held back", w)
	}
	l.Stop()
	l.Record("closed")
	select {
	case w := <-out:
		t.Fatalf("wrote %+v after Stop", w)
	default:
	}
}
