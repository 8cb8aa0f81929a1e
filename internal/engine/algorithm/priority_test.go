package algorithm

import (
	"errors"
	"strings"
	"testing"
)

// TestReserve: a class's reserve is the capacity less ⌊capacity × share
// / 100⌋, at least one unit left to the class; 100 % and anything a
// policy does not name reserve nothing.
func TestReserve(t *testing.T) {
	shares := map[string]int{"critical": 100, "sheddable": 50, "default": 80}
	for _, tc := range []struct {
		capacity int64
		class    string
		want     int64
	}{
		{10, "sheddable", 5}, {11, "sheddable", 6}, {10, "critical", 0}, {10, "", 2}, {10, "default", 2},
		{10, "other", 0}, {1, "sheddable", 0}, {3, "sheddable", 2}, {1_000_000_000, "sheddable", 500_000_000},
	} {
		if got := Reserve(tc.capacity, ShareOf(shares, tc.class)); got != tc.want {
			t.Errorf("Reserve(%d, share of %q) = %d, want %d", tc.capacity, tc.class, got, tc.want)
		}
	}
	if got := ShareOf(nil, ""); got != 100 {
		t.Errorf("ShareOf(nil, \"\") = %d, want 100", got)
	}
}

// TestCheckReserve: only an admission carries a reserve, below the
// capacity, with a cost the class can ever be given; a held spend (local
// quota's block) carries none.
func TestCheckReserve(t *testing.T) {
	p := func(k Kind, reserve int32) []Policy {
		return []Policy{{Kind: k, ID: "p", MaxCost: 10, Params: Params{Limit: 10, Window: 1_000_000, Burst: 10, Reserve: reserve}}}
	}
	for _, tc := range []struct {
		name     string
		op       Op
		policies []Policy
		cost     int64
		want     error  // nil: allowed
		text     string // in the error
	}{
		{"spend within the class", OpSpend, p(KindGCRA, 5), 5, nil, ""},
		{"spend past the class", OpSpend, p(KindGCRA, 5), 6, ErrCostTooHigh, "cost above policy maximum 5 for this priority class (5 of 10 reserved"},
		{"peek", OpPeek, p(KindSlidingWindow, 9), 0, nil, ""},
		{"acquire", OpAcquire, p(KindConcurrency, 9), 3, nil, ""},
		{"refund", OpRefund, p(KindFixedWindow, 5), 1, ErrInvalidRequest, "a refund takes no priority class"},
		{"reserve the whole capacity", OpSpend, p(KindFixedWindow, 10), 1, ErrInvalidRequest, "reserve = 10: must be 0 to capacity − 1, 9"},
		{"negative reserve", OpSpend, p(KindFixedWindow, -1), 1, ErrInvalidRequest, "reserve = -1"},
		{"held spend", OpHold, p(KindGCRA, 5), 1, ErrInvalidRequest, "a hold takes no priority class"},
	} {
		hold := int64(0)
		if tc.op == OpHold {
			hold = 1000
		}
		err := Check(tc.op, tc.policies, tc.cost, hold, map[bool]string{true: "l"}[tc.op == OpAcquire], false)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: Check = %v, want nil", tc.name, err)
		case tc.want != nil && (!errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text)):
			t.Errorf("%s: Check = %v, want %v saying %q", tc.name, err, tc.want, tc.text)
		}
	}
}

// TestCheckShares: class names and shares are named by field, value and
// rule.
func TestCheckShares(t *testing.T) {
	bad := func(field, value, rule string) error { return errors.New(field + " = " + value + ": " + rule) }
	for _, tc := range []struct {
		shares   map[string]int
		capacity int64
		want     string
	}{
		{map[string]int{"critical": 100, "sheddable": 50}, 10, ""},
		{map[string]int{"Shed": 50}, 10, `priorities = "Shed": a class name`},
		{map[string]int{"shed": 0}, 10, "priorities.shed = 0%: must be between 1% and 100%"},
		{map[string]int{"shed": 101}, 10, "priorities.shed = 101%"},
		{map[string]int{"shed": 20}, 4, "priorities.shed = 20%: leaves this class no unit of the policy's capacity of 4: raise the share to at least 25%"},
		{map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1, "h": 1, "i": 1}, 1000, "at most 8 classes"},
	} {
		err := CheckShares(tc.shares, tc.capacity, bad)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckShares(%v, %d) = %v, want %q", tc.shares, tc.capacity, err, tc.want)
		}
	}
}
