package edge

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLazyDeadlineSaysWhatWithDeadlineSays holds lazyDeadline to
// context.WithDeadline: the same deadline, the same errors before and
// after its cancel and past its deadline, Done closing at the deadline
// and on the parent's cancel, the parent's values.
func TestLazyDeadlineSaysWhatWithDeadlineSays(t *testing.T) {
	type key struct{}
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	defer cancelParent()
	at := time.Now().Add(time.Hour)
	c, stop := withLazyDeadline(parent, at)
	if d, ok := c.Deadline(); !ok || !d.Equal(at) {
		t.Errorf("Deadline() = %v, %v; want %v, true", d, ok, at)
	}
	if c.Err() != nil || c.Value(key{}) != "v" {
		t.Errorf("Err() = %v, Value = %v; want nil, v", c.Err(), c.Value(key{}))
	}
	stop()
	if !errors.Is(c.Err(), context.Canceled) {
		t.Errorf("Err() after stop = %v, want Canceled", c.Err())
	}
	<-c.Done() // closed: made after stop

	near, stopNear := withLazyDeadline(parent, time.Now().Add(time.Millisecond))
	defer stopNear()
	<-near.Done() // the timer made on asking closes it at the deadline
	if !errors.Is(near.Err(), context.DeadlineExceeded) {
		t.Errorf("Err() past the deadline = %v, want DeadlineExceeded", near.Err())
	}
	past, stopPast := withLazyDeadline(parent, time.Now().Add(-time.Second))
	defer stopPast()
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Errorf("Err() past the deadline, Done never asked = %v, want DeadlineExceeded", past.Err())
	}

	earlier, cancelEarlier := context.WithDeadline(parent, time.Now().Add(time.Minute))
	defer cancelEarlier()
	child, stopChild := withLazyDeadline(earlier, at)
	defer stopChild()
	if d, _ := earlier.Deadline(); func() bool { cd, _ := child.Deadline(); return !cd.Equal(d) }() {
		t.Errorf("Deadline() under an earlier parent's: want the parent's %v", d)
	}
	waiting, stopWaiting := withLazyDeadline(parent, at)
	defer stopWaiting()
	done := waiting.Done()
	cancelParent()
	<-done
	if !errors.Is(waiting.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
		t.Errorf("Err() after the parent's cancel = %v, %v; want Canceled", waiting.Err(), child.Err())
	}
}
