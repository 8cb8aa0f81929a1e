package logthrottle

import (
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
