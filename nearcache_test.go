package sluice

import (
	"context"
	"testing"
	"time"
)

// stageClock is a clock set by hand, for driving a stage.
type stageClock struct{ now time.Time }

func (c *stageClock) Now() time.Time { return c.now }

// nearStage is a near-cache stage on a clock set by hand, driven the way
// Check drives it.
type nearStage struct {
	*nearCache
	clock *stageClock
}

func newNearStage() nearStage {
	clk := new(stageClock)
	return nearStage{newNearCache(clk), clk}
}

// spend runs a spend of cost by subject under p through the stage at
// now; store, when the stage asks it, answers.
func (c nearStage) spend(subject string, p *Policy, cost int64, now time.Time, store Outcome) (o Outcome, asked bool) {
	c.clock.now = now
	d := &decision{ev: Evaluation{Op: Spend, Subject: subject, Policies: []*Policy{p}, Cost: cost}}
	c.do(context.Background(), d, func(_ context.Context, d *decision) { asked, d.o = true, store })
	return d.o, asked
}

// remember has the store deny a spend of cost at sent with st.
func (c nearStage) remember(subject string, p *Policy, cost int64, sent time.Time, st Status) {
	c.spend(subject, p, cost, sent, Outcome{Kind: Denied, Status: st})
}

// lookup returns the status the stage denies a spend of cost with at now
// without asking the store, if it does.
func (c nearStage) lookup(subject string, p *Policy, cost int64, now time.Time) (Status, bool) {
	o, asked := c.spend(subject, p, cost, now, Outcome{Kind: Allowed})
	return o.Status, !asked && o.FromCache
}

// forget runs a Reset of subject under p through the stage.
func (c nearStage) forget(subject string, p *Policy) {
	d := &decision{ev: Evaluation{Op: Reset, Subject: subject, Policies: []*Policy{p}}}
	c.do(context.Background(), d, func(context.Context, *decision) {})
}

// TestNearCacheNeverPastRetry: a remembered denial covers costs at least
// the denied one, answers waits measured from the asking time, and is gone
// at the retry time measured from when the store was asked.
func TestNearCacheNeverPastRetry(t *testing.T) {
	c := newNearStage()
	p := &Policy{ID: "p", NearCache: true, MaxCost: 10}
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
	c := newNearStage()
	base, raised := &Policy{ID: "p", Limit: 5, NearCache: true, MaxCost: 5}, &Policy{ID: "p", Limit: 500, NearCache: true, MaxCost: 5}
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
