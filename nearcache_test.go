package sluice

import (
	"testing"
	"time"
)

// TestNearCacheNeverPastRetry: a remembered denial covers costs at least
// the denied one, answers waits measured from the asking time, and is gone
// at the retry time measured from when the store was asked.
func TestNearCacheNeverPastRetry(t *testing.T) {
	c := newNearCache()
	p := &Policy{ID: "p"}
	sent := time.Unix(1000, 0)
	c.remember("s", p, 2, sent, Status{Policy: "p", Limit: 5, RetryAfter: 3 * time.Second, ResetAfter: 10 * time.Second})
	if _, ok := c.lookup("s", p, 1, sent.Add(time.Second)); ok {
		t.Fatal("a denial of cost 2 answered for cost 1: the store might admit it")
	}
	st, ok := c.lookup("s", p, 3, sent.Add(time.Second))
	if !ok || st.RetryAfter != 2*time.Second || st.ResetAfter != 9*time.Second {
		t.Fatalf("lookup 1s later = %+v, %v; want denied, retry 2s, reset 9s", st, ok)
	}
	if _, ok := c.lookup("s", p, 2, sent.Add(3*time.Second-time.Nanosecond)); !ok {
		t.Fatal("gone before the retry time")
	}
	if _, ok := c.lookup("s", p, 2, sent.Add(3*time.Second)); ok {
		t.Fatal("still denying at the retry time")
	}
	if _, ok := c.lookup("other", p, 2, sent); ok {
		t.Fatal("another subject answered from s's denial")
	}
	c.remember("s", p, 1, sent, Status{RetryAfter: time.Hour})
	c.forget("s", p)
	if _, ok := c.lookup("s", p, 1, sent); ok {
		t.Fatal("a forgotten denial answered")
	}
}
