package sluice

import (
	"testing"
	"time"
)

// TestNearCacheNeverPastRetry: a remembered denial covers costs at least
// the denied one, answers waits measured from the asking time, and is gone
// at the retry time measured from when the store was asked.
func TestNearCacheNeverPastRetry(t *testing.T) {
	c := newNearCache(nil)
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

// TestNearCacheOneEntryPerPolicyID: a denial remembered under one set of a
// policy's numbers (an override gives a subject others) answers only for
// those numbers, and forgetting the policy under any numbers forgets it,
// so a Reset made while an override applied leaves no denial behind for
// the numbers that come back after it.
func TestNearCacheOneEntryPerPolicyID(t *testing.T) {
	c := newNearCache(nil)
	base, raised := &Policy{ID: "p", Limit: 5}, &Policy{ID: "p", Limit: 500}
	sent := time.Unix(1000, 0)
	c.remember("s", base, 1, sent, Status{Policy: "p", Limit: 5, RetryAfter: time.Hour, ResetAfter: time.Hour})
	if _, ok := c.lookup("s", raised, 1, sent); ok {
		t.Fatal("a denial under limit 5 answered under the override's limit 500")
	}
	c.remember("s", base, 1, sent, Status{Policy: "p", Limit: 5, RetryAfter: time.Hour, ResetAfter: time.Hour})
	c.forget("s", raised) // a Reset while the override applies
	if _, ok := c.lookup("s", base, 1, sent); ok {
		t.Fatal("a denial remembered under the policy's own numbers outlived a Reset made under an override")
	}
}
