package rls

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rules"
)

// TestScratchReset holds reset to what the next request relies on: every
// descriptor, group, entry and buffer a request used is cleared (a group
// keeping only its members' buffer, empty), and a scratch grown past the
// bounds is not kept.
func TestScratchReset(t *testing.T) {
	sc := getScratch()
	sc.ds, sc.gbuf = make([]descriptor, 3), make([]group, 0, 3) // as match and groupDescriptors size them
	rule := &rules.Rule{Key: "d.k"}
	for i := range sc.ds {
		sc.ds[i] = descriptor{rule: rule, subject: "s", dup: 1, lease: "l", release: true, priority: "p", unknownClass: true, ignoredLimit: true,
			cost: 7, refund: true, failedOpen: true, replaced: rule, previous: []string{"old"}, settle: settleCall{id: "e", op: sluice.Estimate, done: true, why: noCost},
			code: 2, remaining: 3, reset: time.Second, timed: true}
		sc.ds[i].verdict = sluice.Status{Policy: "d.k", Allowed: true, Remaining: 3}
		sc.ds[i].decided = &sc.ds[i].verdict
	}
	for range 2 {
		g := sc.newGroup()
		*g = group{subject: "s", cost: 3, lease: "l", quota: true, shadow: true, peek: true, priority: "p", members: append(g.members, 0, 1, 2)}
		sc.groups = append(sc.groups, g)
	}
	sc.entries = append(sc.entries, rules.Entry{Key: "k", Value: "v"})
	sc.vars = append(sc.vars, rules.Entry{Key: "k", Value: "v"})
	sc.id = append(sc.id, "1:k1:v"...)
	if !sc.reset() {
		t.Fatal("reset: a scratch of 3 descriptors is not kept")
	}
	for i, d := range sc.ds[:cap(sc.ds)] {
		if !reflect.ValueOf(d).IsZero() {
			t.Errorf("descriptor %d after reset: %+v, want zero", i, d)
		}
	}
	for i := range sc.gbuf[:cap(sc.gbuf)] {
		g := sc.gbuf[:cap(sc.gbuf)][i]
		if len(g.members) != 0 {
			t.Errorf("group %d after reset has members %v", i, g.members)
		}
		g.members = nil
		if !reflect.ValueOf(g).IsZero() {
			t.Errorf("group %d after reset: %+v, want zero", i, g)
		}
	}
	for _, g := range sc.groups[:cap(sc.groups)] {
		if g != nil {
			t.Errorf("groups after reset still point at %+v", g)
		}
	}
	for _, es := range [][]rules.Entry{sc.entries[:cap(sc.entries)], sc.vars[:cap(sc.vars)]} {
		for _, e := range es {
			if e != (rules.Entry{}) {
				t.Errorf("entry %+v after reset, want zero", e)
			}
		}
	}
	if len(sc.ds) != 0 || len(sc.groups) != 0 || len(sc.gbuf) != 0 || len(sc.entries) != 0 || len(sc.vars) != 0 || len(sc.id) != 0 {
		t.Errorf("reset leaves lengths %d %d %d %d %d %d, want all 0", len(sc.ds), len(sc.groups), len(sc.gbuf), len(sc.entries), len(sc.vars), len(sc.id))
	}

	big := getScratch()
	big.ds = make([]descriptor, keepDescriptors+1)
	if big.reset() {
		t.Errorf("reset keeps a scratch of %d descriptors, past the bound %d", keepDescriptors+1, keepDescriptors)
	}
}

// TestReplyStatuses holds reply's statuses to the messages they replace:
// one per descriptor from the reply's own slots, then allocated alone,
// never one handed out twice.
func TestReplyStatuses(t *testing.T) {
	rule := &rules.Rule{Name: "n", RequestsPerUnit: 5, Unit: rules.Unit(3)}
	for _, n := range []int{1, 3} {
		rp := newReply(n)
		if len(rp.resp.Statuses) != n {
			t.Fatalf("newReply(%d): %d statuses", n, len(rp.resp.Statuses))
		}
		seen := map[*slot]bool{}
		for i := range n + 2 {
			sl := rp.status(2, rule)
			if seen[sl] {
				t.Fatalf("newReply(%d): status %d handed out twice", n, i)
			}
			seen[sl] = true
			l := sl.status.CurrentLimit
			if sl.status.Code != 2 || l == nil || l.Name != "n" || l.RequestsPerUnit != 5 || int(l.Unit) != 3 || sl.status.DurationUntilReset != nil {
				t.Errorf("newReply(%d): status %d = %v", n, i, &sl.status)
			}
		}
		if sl := rp.status(1, nil); sl.status.CurrentLimit != nil {
			t.Errorf("a status without a rule has current_limit %v", sl.status.CurrentLimit)
		}
	}
}

// TestUntilReset holds slot.untilReset to durationpb.New, which it
// replaces.
func TestUntilReset(t *testing.T) {
	for _, d := range []time.Duration{0, 1, time.Second - 1, time.Second, 1500 * time.Millisecond, time.Hour, -1, -1500 * time.Millisecond, 1<<63 - 1, -1 << 63} {
		var sl slot
		sl.untilReset(d)
		if want := durationpb.New(d); !proto.Equal(sl.status.DurationUntilReset, want) {
			t.Errorf("untilReset(%v) = %v, want %v", d, sl.status.DurationUntilReset, want)
		}
	}
}
